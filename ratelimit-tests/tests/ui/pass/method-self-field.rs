// `<self.field>` and `<self>` in inherent methods taking `&self`, `&mut self`
// and `self`.
use std::fmt;

use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

struct Tenant {
    id: u32,
}

struct Client {
    tenant: Tenant,
    calls: u32,
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client-{}", self.tenant.id)
    }
}

impl Client {
    #[rate_limit(key = "search:<self.tenant.id>", capacity = 1, rate = "1/h")]
    async fn search(&self, query: &str) -> Result<usize, Limited> {
        Ok(query.len())
    }

    #[rate_limit(key = "write:<self>", capacity = 1, rate = "1/h")]
    async fn write(&mut self) -> Result<u32, Limited> {
        self.calls += 1;
        Ok(self.calls)
    }

    #[rate_limit(key = "close:<self.tenant.id>", capacity = 1, rate = "1/h")]
    async fn close(self) -> Result<u32, Limited> {
        Ok(self.tenant.id)
    }
}

#[tokio::main]
async fn main() {
    let mut client = Client {
        tenant: Tenant { id: 3 },
        calls: 0,
    };
    assert_eq!(client.search("abc").await.unwrap(), 3);
    let denied = client.search("abc").await.unwrap_err().0;
    assert_eq!(denied.key, "search:3");
    assert_eq!(client.write().await.unwrap(), 1);
    assert_eq!(client.write().await.unwrap_err().0.key, "write:client-3");
    assert_eq!(client.close().await.unwrap(), 3);
}
