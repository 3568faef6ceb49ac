//! What the reconciler answers on its admin port (the runtime's router):
//! `/readyz` when the store is listed and its watch is up (and the
//! target's watches have listed), `/metrics` with the gauges refreshed.
//! It reads the controller's [`State`] only.

use gantry_runtime::admin::Admin;

use crate::controller::State;

#[tonic::async_trait]
impl Admin for State {
    async fn readiness(&self) -> Result<(), String> {
        State::readiness(self).map_err(|reason| format!("not ready: {reason}"))
    }

    fn metrics(&self) -> String {
        self.update_gauges();
        self.metrics.encode()
    }
}
