// `key = <expression>`: the expression's `Display` value is the whole key,
// with `%`, `{` and `}` escaped.
use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

struct Request {
    path: String,
    ip: [u8; 4],
}

#[rate_limit(key = format!("http:{}:{}", req.path, req.ip.map(|b| b.to_string()).join(".")), capacity = 1, rate = "1/min")]
async fn handle(req: &Request) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = name, capacity = 1, rate = "1/min")]
async fn by_name(name: &str) -> Result<(), Limited> {
    Ok(())
}

#[tokio::main]
async fn main() {
    let req = Request {
        path: "/a".into(),
        ip: [10, 0, 0, 1],
    };
    assert!(handle(&req).await.is_ok());
    assert_eq!(handle(&req).await.unwrap_err().0.key, "http:/a:10.0.0.1");
    assert!(by_name("{x}:100%").await.is_ok());
    assert_eq!(
        by_name("{x}:100%").await.unwrap_err().0.key,
        "%7Bx%7D:100%25"
    );
}
