// Functions a `macro_rules!` builds from fragments of its own body and of
// its invocation: a return type and key templates passed in, one naming a
// parameter and one `self`, both written in the macro's body.
use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

macro_rules! returning {
    ($name:ident -> $ret:ty) => {
        #[rate_limit(key = "returning", capacity = 1, rate = "1/h")]
        async fn $name() -> $ret {
            Ok(())
        }
    };
}

returning!(ping -> Result<(), Limited>);

macro_rules! keyed {
    ($name:ident, $key:literal) => {
        #[rate_limit(key = $key, capacity = 1, rate = "1/h")]
        async fn $name(user: u64) -> Result<u64, Limited> {
            Ok(user)
        }
    };
}

keyed!(by_user, "user:<user>");

struct Tenant {
    id: u32,
}

macro_rules! method_keyed {
    ($key:literal) => {
        impl Tenant {
            #[rate_limit(key = $key, capacity = 1, rate = "1/h")]
            async fn call(&self) -> Result<u32, Limited> {
                Ok(self.id)
            }
        }
    };
}

method_keyed!("tenant:<self.id>");

#[tokio::main]
async fn main() {
    assert!(ping().await.is_ok());
    assert!(ping().await.is_err());
    assert_eq!(by_user(7).await.unwrap(), 7);
    assert_eq!(by_user(7).await.unwrap_err().0.key, "user:7");
    let tenant = Tenant { id: 3 };
    assert_eq!(tenant.call().await.unwrap(), 3);
    assert_eq!(tenant.call().await.unwrap_err().0.key, "tenant:3");
}
