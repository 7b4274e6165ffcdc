// `refund_on` keeps the body as written, the coercions at its `return`s
// included: `return Err(Box::new(e))` in a function returning
// `Box<dyn Error>`, and `return Ok(&self.name)` in one returning `&'a str`.
use std::error::Error;
use std::fmt;

use ratelimit::rate_limit;

#[derive(Debug)]
struct Bad;

impl fmt::Display for Bad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bad")
    }
}

impl Error for Bad {}

#[rate_limit(key = "coerce:<x>", capacity = 10, rate = 1, refund_on = err)]
async fn boxed(x: u32) -> Result<u32, Box<dyn Error + Send + Sync>> {
    if x == 0 {
        return Err(Box::new(Bad));
    }
    Ok(x)
}

struct Named {
    name: String,
}

impl Named {
    #[rate_limit(key = "deref:<self.name>", capacity = 10, rate = 1, refund_on = err)]
    async fn pick<'a>(&'a self, x: &'a str) -> Result<&'a str, Box<dyn Error + Send + Sync>> {
        if x.is_empty() {
            return Ok(&self.name);
        }
        Ok(x)
    }
}

#[tokio::main]
async fn main() {
    assert!(boxed(0).await.is_err());
    let named = Named { name: "n".into() };
    assert_eq!(named.pick("").await.unwrap(), "n");
}
