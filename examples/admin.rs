//! An operator's command line for a limiter whose state lives in Redis:
//! inspect one key, give one key its quota back, and list, set or remove
//! the named rules every instance follows (through `RedisRuleSource`).
//!
//! ```sh
//! cargo run --example admin -- inspect "capacity=10 rate=2/s" order:submit:42
//! cargo run --example admin -- inspect order_submit order:submit:42   # a named rule
//! cargo run --example admin -- reset order:submit:42
//! cargo run --example admin -- rules
//! cargo run --example admin -- set order_submit "capacity=20 rate=5/s"
//! cargo run --example admin -- remove order_submit
//! ```
//!
//! Redis is `--redis URL` or `REDIS_URL` (default `redis://127.0.0.1:6379`);
//! `--prefix` is the limiter's key prefix (default `rl:`). Keys are given as
//! the application builds them, without the prefix.

use std::process::ExitCode;
use std::time::Duration;

use ratelimit::{Limiter, Quota, RedisRuleSource};

const USAGE: &str = "usage: admin [--redis URL] [--prefix PREFIX] <command>
commands:
  inspect <rule name or rule text> <key> [cost]   the decision a call would get now; consumes nothing
  reset <key>                                     give the key its whole quota back
  rules                                           list the named rules in Redis
  set <name> <rule text>                          store and announce a rule, such as \"capacity=10 rate=2/s\"
  remove <name>                                   remove a rule; instances go back to their defaults";

/// A failure the operator can act on: what went wrong and what to do.
struct Failure(String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(error: E) -> Self {
        Failure(error.to_string())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut prefix = ratelimit::DEFAULT_PREFIX.to_owned();
    while let Some(flag) = args.first().filter(|a| a.starts_with("--")).cloned() {
        args.remove(0);
        let value = if args.is_empty() {
            None
        } else {
            Some(args.remove(0))
        };
        match (flag.as_str(), value) {
            ("--redis", Some(value)) => url = value,
            ("--prefix", Some(value)) => prefix = value,
            (flag, _) => return usage(&format!("`{flag}` needs a value, or is not an option")),
        }
    }
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["inspect", rule, key] => inspect(&url, &prefix, rule, key, "1").await,
        ["inspect", rule, key, cost] => inspect(&url, &prefix, rule, key, cost).await,
        ["reset", key] => reset(&url, &prefix, key).await,
        ["rules"] => list(&url).await,
        ["set", name, rule] => set(&url, name, rule).await,
        ["remove", name] => remove(&url, name).await,
        [] => return usage("no command given"),
        [command, ..] => {
            return usage(&format!(
                "`{command}` is not a command, or has the wrong arguments"
            ))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message)) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("error: {problem}\n{USAGE}");
    ExitCode::from(2)
}

fn limiter(url: &str, prefix: &str) -> Result<Limiter, Failure> {
    Ok(Limiter::builder()
        .redis(url)
        .prefix(prefix)
        .timeout(Duration::from_secs(2))
        .build()?)
}

/// The quota of `rule`: rule text (it has a `=`), or the name of a rule
/// stored in Redis.
async fn quota_of(url: &str, rule: &str) -> Result<Quota, Failure> {
    if rule.contains('=') {
        return rule
            .parse()
            .map_err(|e| Failure(format!("invalid rule `{rule}`: {e}")));
    }
    let limiter = Limiter::memory();
    let source = read_rules(url, &limiter).await?;
    let quota = limiter.rules().get(rule);
    source.stop();
    quota.ok_or_else(|| {
        Failure(format!(
            "no rule named `{rule}` in Redis; give the rule's text instead, such as \"capacity=10 rate=2/s\", or list the rules with `admin rules`"
        ))
    })
}

async fn read_rules(url: &str, limiter: &Limiter) -> Result<RedisRuleSource, Failure> {
    let source = RedisRuleSource::builder(url)
        .timeout(Duration::from_secs(2))
        .start(limiter)?;
    if !matches!(
        tokio::time::timeout(Duration::from_secs(3), source.ready()).await,
        Ok(Ok(()))
    ) {
        source.stop();
        // The cause, named as every other command names it: a refused
        // connection, a wrong password, an untrusted certificate, ...
        self::limiter(url, ratelimit::DEFAULT_PREFIX)?
            .ping()
            .await?;
        return Err(Failure(format!(
            "could not read the rules from Redis at {} within 3 s",
            redacted(url)
        )));
    }
    Ok(source)
}

async fn inspect(
    url: &str,
    prefix: &str,
    rule: &str,
    key: &str,
    cost: &str,
) -> Result<(), Failure> {
    let cost: u64 = cost
        .parse()
        .map_err(|_| Failure(format!("the cost `{cost}` is not a whole number")))?;
    let quota = quota_of(url, rule).await?;
    let decision = limiter(url, prefix)?.inspect(&quota, key, cost).await?;
    let verdict = if decision.allowed {
        "would be admitted"
    } else {
        "would be denied"
    };
    println!(
        "{key} under {quota}: a call of cost {cost} {verdict}; {} of {} remaining; retry after {:?}; full again in {:?}",
        decision.remaining, decision.limit, decision.retry_after, decision.reset_after
    );
    Ok(())
}

async fn reset(url: &str, prefix: &str, key: &str) -> Result<(), Failure> {
    limiter(url, prefix)?.reset(key).await?;
    println!(
        "{key}: quota given back (other instances' cached denials end within their retry_after)"
    );
    Ok(())
}

async fn list(url: &str) -> Result<(), Failure> {
    let limiter = Limiter::memory();
    let source = read_rules(url, &limiter).await?;
    let mut names = limiter.rules().names();
    names.sort();
    if names.is_empty() {
        println!("no rules in Redis; every instance uses its attributes' own numbers");
    }
    for name in names {
        if let Some(quota) = limiter.rules().get(&name) {
            println!("{name}: {quota}");
        }
    }
    source.stop();
    Ok(())
}

async fn set(url: &str, name: &str, rule: &str) -> Result<(), Failure> {
    let quota = RedisRuleSource::publish(url, name, rule).await?;
    println!("{name}: {quota}, announced to every instance");
    Ok(())
}

async fn remove(url: &str, name: &str) -> Result<(), Failure> {
    if RedisRuleSource::remove(url, name).await? {
        println!("{name}: removed; instances go back to their attributes' own numbers");
    } else {
        println!("{name}: there was no such rule");
    }
    Ok(())
}

/// The URL without its password, for messages.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}
