//! gantry-core: the rules of the Gateway resource, with no IO.
//!
//! The store calls these functions inside its write transaction, so what
//! they decide is what commits:
//!
//! ```text
//! request ──► access (role owns the mask paths?) ──► validation
//!         ──► canonical (did the spec change? generation + 1)
//!         ──► status (observed_generation range, step merge, conditions)
//!         ──► lifecycle::Write { Put | Remove | Unchanged }
//! ```

#![forbid(unsafe_code)]

pub mod access;
pub mod canonical;
pub mod duration;
pub mod error;
pub mod fingerprint;
pub mod lifecycle;
pub mod recovery;
pub mod retry;
pub mod selector;
pub mod status;
pub mod syntax;
pub mod validation;

pub use access::{FieldPath, Role};
pub use error::{FieldViolation, RuleError};
pub use lifecycle::Write;
pub use selector::Selector;
