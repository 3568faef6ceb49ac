//! The store half every reconciler test stands on: a gateway-store process
//! on a database in a scratch directory, and [`Gateways`] to call it. A
//! test's own rig adds its reconciler (in process against kube-fake, or
//! processes against a real control plane) and derefs to this, so the
//! store calls are written once.

use std::ops::Deref;
use std::path::PathBuf;

use crate::calls::Gateways;
use crate::env::temp_dir;
use crate::services::StoreProcess;

/// A store process and its client.
#[derive(Debug)]
pub struct StoreRig {
    pub store: StoreProcess,
    pub gateways: Gateways,
    /// The scratch directory (the store's data and logs).
    pub dir: PathBuf,
}

impl StoreRig {
    /// A store on a SQLite file in a fresh directory named after `label`.
    pub fn start(label: &str) -> StoreRig {
        let dir = temp_dir(label);
        let database = format!("sqlite://{}", dir.join("gantry.db").display());
        Self::on(&database, dir)
    }

    /// A store on `database_url`, its data and logs in `dir`.
    pub fn on(database_url: &str, dir: PathBuf) -> StoreRig {
        let store = StoreProcess::start(database_url, &dir);
        let gateways = Gateways::new(store.client());
        StoreRig { store, gateways, dir }
    }
}

impl Deref for StoreRig {
    type Target = Gateways;

    fn deref(&self) -> &Gateways {
        &self.gateways
    }
}
