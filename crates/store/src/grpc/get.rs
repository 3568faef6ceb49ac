//! GetGateway: one gateway as committed, read from the database.

use gantry_api::v1::{Gateway, GetGatewayRequest};
use gantry_core::{validation, RuleError};
use tonic::Status;

use super::errors::{rule_status, storage_status};
use crate::storage::Storage;

pub(super) async fn get(
    storage: &dyn Storage,
    request: GetGatewayRequest,
) -> Result<Gateway, Status> {
    let name = request.name;
    validation::validate_name("name", &name).map_err(|e| rule_status(&e))?;
    storage
        .get(&name)
        .await
        .map_err(storage_status)?
        .ok_or_else(|| rule_status(&RuleError::NotFound(name)))
}
