//! A Gateway for tests, built in one line and changed fluently:
//! `gateway("edge").image("gw:2").replicas(3).label("team", "a").build()`.

use gantry_api::v1::{Gateway, GatewaySpec, ObjectMeta, Route};

/// The image a test gateway runs unless told otherwise.
pub const IMAGE: &str = "ghcr.io/acme/gw:1";

/// A gateway named `name` running [`IMAGE`].
pub fn gateway(name: &str) -> GatewayBuilder {
    GatewayBuilder(Gateway {
        metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
        spec: Some(GatewaySpec { image: IMAGE.into(), ..Default::default() }),
        status: None,
    })
}

/// Only the name of gateway `name`, no spec: what an update of its
/// metadata or a change of its whole spec sends.
pub fn named(name: &str) -> GatewayBuilder {
    GatewayBuilder(Gateway {
        metadata: Some(ObjectMeta { name: name.into(), ..Default::default() }),
        spec: None,
        status: None,
    })
}

/// A [`Gateway`] being built.
#[derive(Debug, Clone)]
pub struct GatewayBuilder(Gateway);

impl GatewayBuilder {
    fn spec(&mut self) -> &mut GatewaySpec {
        self.0.spec.get_or_insert_with(Default::default)
    }

    fn meta(&mut self) -> &mut ObjectMeta {
        self.0.metadata.get_or_insert_with(Default::default)
    }

    #[must_use]
    pub fn image(mut self, image: &str) -> Self {
        self.spec().image = image.into();
        self
    }

    #[must_use]
    pub fn replicas(mut self, replicas: i32) -> Self {
        self.spec().replicas = Some(replicas);
        self
    }

    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.meta().labels.insert(key.into(), value.into());
        self
    }

    #[must_use]
    pub fn config(mut self, key: &str, value: &str) -> Self {
        self.spec().config.insert(key.into(), value.into());
        self
    }

    /// A route to `host`.
    #[must_use]
    pub fn route(mut self, host: &str) -> Self {
        self.spec().route = Some(Route { host: host.into(), ..Default::default() });
        self
    }

    /// A config value of `bytes` bytes, so the gateway weighs several KB
    /// as real ones do.
    #[must_use]
    pub fn weighing(self, bytes: usize) -> Self {
        self.config("padding", &"x".repeat(bytes))
    }

    /// `spec` as its whole spec.
    #[must_use]
    pub fn with_spec(mut self, spec: GatewaySpec) -> Self {
        self.0.spec = Some(spec);
        self
    }

    /// An annotation.
    #[must_use]
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.meta().annotations.insert(key.into(), value.into());
        self
    }

    /// The version the write is conditional on.
    #[must_use]
    pub fn at_version(mut self, resource_version: i64) -> Self {
        self.meta().resource_version = resource_version;
        self
    }

    pub fn build(self) -> Gateway {
        self.0
    }

    /// Its spec alone.
    pub fn spec_only(self) -> GatewaySpec {
        self.0.spec.unwrap_or_default()
    }
}

impl From<GatewayBuilder> for Gateway {
    fn from(builder: GatewayBuilder) -> Self {
        builder.build()
    }
}
