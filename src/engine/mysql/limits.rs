//! Concurrency limits on MySQL: not built yet; every call says so.

use super::Store;
use crate::engine::LimitStore;
use crate::error::{Error, Result};
use crate::limit::{Limit, LimitInfo, LimitKeyUsage};

fn unsupported() -> Error {
    Error::Unsupported {
        what: "concurrency limits",
        engine: ENGINE,
    }
}

const ENGINE: &str = "MySQL";

impl LimitStore for Store {
    fn set_limit(&self, _name: &str, _limit: &Limit) -> Result<()> {
        Err(unsupported())
    }

    fn delete_limit(&self, _name: &str) -> Result<bool> {
        Err(unsupported())
    }

    fn limits(&self) -> Result<Vec<LimitInfo>> {
        Ok(Vec::new())
    }

    fn limit_usage(&self, _name: Option<&str>) -> Result<Vec<LimitKeyUsage>> {
        Ok(Vec::new())
    }

    fn sweep_limits(
        &self,
        _after: Option<&(String, String)>,
    ) -> Result<(u64, Option<(String, String)>)> {
        Ok((0, None))
    }
}
