//! Wall-clock helpers: the shared ones from `corral_spec::time`.

pub use corral_spec::time::{now_ms, rfc3339};
