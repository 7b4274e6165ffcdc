// The generated code names everything by absolute path, so it compiles
// where nothing is in scope.
#![no_implicit_prelude]

extern crate ratelimit;
extern crate std;

struct Error;

impl ::std::convert::From<::ratelimit::RateLimited> for Error {
    fn from(_: ::ratelimit::RateLimited) -> Self {
        Error
    }
}

struct Account {
    tenant: u32,
}

impl Account {
    #[::ratelimit::rate_limit(key = "acct:<self.tenant>:<user>", capacity = 3, rate = "1/s")]
    #[::ratelimit::rate_limit(key = <u32 as ::std::string::ToString>::to_string(&self.tenant), capacity = 3, rate = 2.5, cost = n)]
    async fn act(&self, user: &str, n: u8) -> ::std::result::Result<(), Error> {
        let _ = (user, n);
        ::std::result::Result::Ok(())
    }
}

#[::ratelimit::rate_limit(key = "free", capacity = 1, rate = 1, limiter = ::ratelimit::global())]
async fn free() -> ::std::result::Result<(), Error> {
    ::std::result::Result::Ok(())
}

fn tier(user: &::std::primitive::u32) -> ::ratelimit::Quota {
    let _ = user;
    ::std::result::Result::unwrap(::ratelimit::Quota::per_second(1))
}

#[::ratelimit::rate_limit(rule = "named", key = "named:<user>", capacity = 2, rate = 1, limiter = ::ratelimit::global())]
#[::ratelimit::rate_limit(key = "tiered:<user>", quota = tier(&user), exempt = user == 0)]
async fn rules(user: ::std::primitive::u32) -> ::std::result::Result<(), Error> {
    ::std::result::Result::Ok(())
}

fn main() {
    let _ = Account { tenant: 1 }.act("a", 1);
    let _ = free();
    let _ = rules(1);
}
