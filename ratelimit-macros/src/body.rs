//! Where the checks go: first in the body of an `async fn`, or first in the
//! async block that a plain `fn` returns, as `#[async_trait]` writes its
//! methods.
//!
//! An attribute on an item expands before the attributes of the items inside
//! it, so on a method of an `#[async_trait]` impl or trait `#[rate_limit]`
//! receives async-trait's output:
//!
//! ```text
//! fn put<'life0, 'async_trait>(&'life0 self, key: u64)
//!     -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<(), E>>
//!         + ::core::marker::Send + 'async_trait>>
//! where 'life0: 'async_trait, Self: 'async_trait
//! {
//!     Box::pin(async move {
//!         if let Some(__ret) = None::<Result<(), E>> { return __ret; }
//!         let __self = self;
//!         let key = key;
//!         let __ret: Result<(), E> = { /* the body, `self` written `__self` */ };
//!         __ret
//!     })
//! }
//! ```
//!
//! Checks put before the function's `Box::pin` would run when the future is
//! created, not when it is polled, and a `return` there would have to give a
//! future; inside the async block they run as in an `async fn`, before the
//! body, and still see `self` and every parameter by its own name (the block
//! captures them). tracing's `#[instrument]` finds the block the same way
//! (tracing-attributes, `AsyncInfo::from_fn`).

use syn::{
    Block, Expr, ExprAsync, GenericArgument, Ident, ItemFn, Pat, Path, PathArguments, ReturnType,
    Stmt, Type, TypeParamBound,
};

/// How the function runs its body.
pub(crate) enum Body<'a> {
    /// `async fn`.
    Async,
    /// A `fn` whose last expression is `async move { .. }` or
    /// `Box::pin(async move { .. })`.
    Returned {
        /// `T` of the `Future<Output = T>` named in the return type, when it
        /// names one.
        output: Option<&'a Type>,
        /// The patterns async-trait moved into the block, by the name of the
        /// parameter that replaced them in the signature (`__arg1`).
        patterns: Vec<(&'a Ident, &'a Pat)>,
    },
    /// Neither: the attribute cannot apply.
    Other,
}

impl<'a> Body<'a> {
    pub(crate) fn of(function: &'a ItemFn) -> Self {
        if function.sig.asyncness.is_some() {
            return Body::Async;
        }
        let ReturnType::Type(_, ty) = &function.sig.output else {
            return Body::Other;
        };
        match tail(&function.block).and_then(returned_async) {
            Some(block) => Body::Returned {
                output: future_output(ty),
                patterns: block.block.stmts.iter().filter_map(moved_pattern).collect(),
            },
            None => Body::Other,
        }
    }
}

/// Whether `function` is what a runtime's entry attribute made of an
/// `async fn` above which it was written: `#[tokio::main]` and
/// `#[tokio::test]` write a plain `fn` whose body starts with
/// `let body = async { .. };` and ends by running it with `block_on`.
pub(crate) fn run_by_a_runtime(function: &ItemFn) -> bool {
    if function.sig.asyncness.is_some() {
        return false;
    }
    let starts_with_async_body = matches!(
        function.block.stmts.first(),
        Some(Stmt::Local(syn::Local {
            pat: Pat::Ident(binding),
            init: Some(syn::LocalInit { expr, .. }),
            ..
        })) if binding.ident == "body" && matches!(&**expr, Expr::Async(_))
    );
    starts_with_async_body
        && names(
            quote::ToTokens::to_token_stream(&function.block),
            "block_on",
        )
}

/// Whether `tokens` hold the identifier `name`, at any depth.
fn names(tokens: proc_macro2::TokenStream, name: &str) -> bool {
    tokens.into_iter().any(|token| match token {
        proc_macro2::TokenTree::Ident(ident) => ident == name,
        proc_macro2::TokenTree::Group(group) => names(group.stream(), name),
        _ => false,
    })
}

/// The block the checks go first in: the function's own, or the async block
/// it returns.
pub(crate) fn checked_block(function: &mut ItemFn) -> &mut Block {
    let returns_async = function.sig.asyncness.is_none()
        && tail(&function.block).is_some_and(|expr| returned_async(expr).is_some());
    if !returns_async {
        return &mut function.block;
    }
    match function.block.stmts.last_mut() {
        Some(Stmt::Expr(expr, None)) => returned_async_mut(expr).map(|block| &mut block.block),
        _ => None,
    }
    .expect("the tail was recognised as an async block")
}

fn tail(block: &Block) -> Option<&Expr> {
    match block.stmts.last()? {
        Stmt::Expr(expr, None) => Some(expr),
        _ => None,
    }
}

/// `async move { .. }`, or `Box::pin(async move { .. })` by any path ending
/// in `Box::pin` (async-trait writes `Box::pin`, others `::std::boxed::Box::pin`).
fn returned_async(expr: &Expr) -> Option<&ExprAsync> {
    match expr {
        Expr::Async(block) => Some(block),
        Expr::Call(call) if call.args.len() == 1 && is_box_pin(&call.func) => match &call.args[0] {
            Expr::Async(block) => Some(block),
            _ => None,
        },
        _ => None,
    }
}

fn returned_async_mut(expr: &mut Expr) -> Option<&mut ExprAsync> {
    match expr {
        Expr::Async(block) => Some(block),
        Expr::Call(call) if call.args.len() == 1 && is_box_pin(&call.func) => {
            match &mut call.args[0] {
                Expr::Async(block) => Some(block),
                _ => None,
            }
        }
        _ => None,
    }
}

fn is_box_pin(func: &Expr) -> bool {
    let Expr::Path(path) = func else { return false };
    let segments: Vec<_> = path.path.segments.iter().map(|s| &s.ident).collect();
    matches!(segments[..], [.., boxed, pin] if boxed == "Box" && pin == "pin")
}

/// async-trait's `let (a, b) = { let __arg1 = __arg1; __arg1 };`: the
/// pattern the parameter `__arg1` stands for.
fn moved_pattern(stmt: &Stmt) -> Option<(&Ident, &Pat)> {
    let Stmt::Local(local) = stmt else {
        return None;
    };
    let Expr::Block(init) = &*local.init.as_ref()?.expr else {
        return None;
    };
    let Expr::Path(moved) = tail(&init.block)? else {
        return None;
    };
    let ident = moved.path.get_ident()?;
    ident
        .to_string()
        .strip_prefix("__arg")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .then_some((ident, &local.pat))
}

/// `T` in `Pin<Box<dyn Future<Output = T> + Send + 'a>>`,
/// `impl Future<Output = T>` and the like: the first `Future<Output = ..>`
/// found, outermost first.
fn future_output(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Paren(paren) => future_output(&paren.elem),
        Type::Group(group) => future_output(&group.elem),
        Type::Path(path) if path.qself.is_none() => path_output(&path.path),
        Type::TraitObject(object) => bounds_output(object.bounds.iter()),
        Type::ImplTrait(bounds) => bounds_output(bounds.bounds.iter()),
        _ => None,
    }
}

fn bounds_output<'a>(mut bounds: impl Iterator<Item = &'a TypeParamBound>) -> Option<&'a Type> {
    bounds.find_map(|bound| match bound {
        TypeParamBound::Trait(bound) => path_output(&bound.path),
        _ => None,
    })
}

fn path_output(path: &Path) -> Option<&Type> {
    path.segments.iter().find_map(|segment| {
        let PathArguments::AngleBracketed(args) = &segment.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc)
                if segment.ident == "Future" && assoc.ident == "Output" =>
            {
                Some(&assoc.ty)
            }
            GenericArgument::Type(ty) => future_output(ty),
            _ => None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::ToTokens as _;

    fn output(ty: &str) -> Option<String> {
        let ty: Type = syn::parse_str(ty).unwrap();
        future_output(&ty).map(|t| t.to_token_stream().to_string())
    }

    #[test]
    fn the_output_is_found_in_the_return_types_futures_are_written_with() {
        assert_eq!(
            output(
                "::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u8, E>> \
                 + ::core::marker::Send + 'async_trait>>"
            )
            .as_deref(),
            Some("Result < u8 , E >")
        );
        assert_eq!(
            output("impl Future<Output = io::Result<()>> + Send").as_deref(),
            Some("io :: Result < () >")
        );
        assert_eq!(
            output("Pin<Box<dyn Future<Output = Box<dyn Future<Output = u8>>>>>").as_deref(),
            Some("Box < dyn Future < Output = u8 > >"),
            "the outermost future's output"
        );
        assert_eq!(output("BoxFuture<'static, Result<u8, E>>"), None);
        assert_eq!(output("Result<u8, E>"), None);
    }

    fn body(item: &str) -> &'static str {
        let function: ItemFn = syn::parse_str(item).unwrap();
        match Body::of(&function) {
            Body::Async => "async",
            Body::Returned { .. } => "returned",
            Body::Other => "other",
        }
    }

    #[test]
    fn a_returned_async_block_is_recognised_only_as_the_last_expression() {
        let ret = "-> Pin<Box<dyn Future<Output = Result<(), E>> + Send>>";
        assert_eq!(
            body(&format!(
                "fn f() {ret} {{ Box::pin(async move {{ Ok(()) }}) }}"
            )),
            "returned"
        );
        assert_eq!(
            body(&format!(
                "fn f() {ret} {{ let x = 1; ::std::boxed::Box::pin(async {{ Ok(()) }}) }}"
            )),
            "returned"
        );
        assert_eq!(
            body("fn f() -> impl Future<Output = u8> { async move { 1 } }"),
            "returned"
        );
        assert_eq!(body(&format!("fn f() {ret} {{ Box::pin(g()) }}")), "other");
        assert_eq!(
            body(&format!("fn f() {ret} {{ Box::pin(async {{ Ok(()) }}); }}")),
            "other"
        );
        assert_eq!(
            body(&format!("fn f() {ret} {{ Rc::pin(async {{ Ok(()) }}) }}")),
            "other"
        );
        assert_eq!(body("fn f() { async {}; }"), "other");
        assert_eq!(body("async fn f() -> u8 { 1 }"), "async");
    }

    /// `#[tokio::main]` written above `#[rate_limit]` expands first, and
    /// gives it a plain `fn` running the body in a runtime (tokio-macros'
    /// output, trimmed).
    #[test]
    fn a_body_run_by_a_runtime_is_recognised() {
        let run = |item: &str| run_by_a_runtime(&syn::parse_str(item).unwrap());
        assert!(run("fn main() -> Result<(), E> {
                let body = async { Ok(()) };
                let body = { if false { let _: &dyn Future<Output = Result<(), E>> = &body; } body };
                {
                    use tokio::runtime::Builder;
                    return Builder::new_multi_thread().enable_all().build()
                        .expect(\"Failed building the Runtime\").block_on(body);
                }
            }"));
        assert!(!run(
            "fn f() -> Result<(), E> { let body = async { Ok(()) }; Ok(()) }"
        ));
        assert!(!run("fn f() -> u8 { rt.block_on(async { 1 }) }"));
        assert!(!run(
            "async fn f() -> u8 { let body = async { 1 }; rt.block_on(body) }"
        ));
    }

    #[test]
    fn async_traits_moved_patterns_are_found_by_their_parameter() {
        let function: ItemFn = syn::parse_str(
            "fn f(__arg0: (u8, u8), b: u8) -> Pin<Box<dyn Future<Output = ()>>> {
                Box::pin(async move {
                    let (x, y) = { let __arg0 = __arg0; __arg0 };
                    let b = b;
                    let z = { let w = 1; w };
                })
            }",
        )
        .unwrap();
        let Body::Returned { patterns, .. } = Body::of(&function) else {
            panic!("a returned async block")
        };
        let found: Vec<String> = patterns
            .iter()
            .map(|(ident, pat)| format!("{ident} = {}", pat.to_token_stream()))
            .collect();
        assert_eq!(found, ["__arg0 = (x , y)"]);
    }
}
