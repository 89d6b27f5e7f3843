//! Rewriting of kernel bodies: control flow becomes calls into the tracing front-end,
//! unsupported syntax becomes a compile error at its span.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit::{self, Visit};
use syn::visit_mut::{self, VisitMut};
use syn::{BinOp, Expr, Ident, Pat, Stmt};

/// Macros a kernel body may call: they run at comptime, while the kernel is built.
const ALLOWED_MACROS: &[&str] = &[
    "assert",
    "assert_eq",
    "assert_ne",
    "debug_assert",
    "debug_assert_eq",
    "debug_assert_ne",
    "panic",
    "unreachable",
    "println",
    "eprintln",
    "format",
    "matches",
    "vec",
    "concat",
    "stringify",
    "line",
    "file",
    "column",
];

/// Rewrites a kernel (or helper) body in place, collecting errors.
pub struct Rewriter {
    /// Errors at the user's spans.
    pub errors: Vec<syn::Error>,
}

impl Rewriter {
    pub fn new() -> Rewriter {
        Rewriter { errors: Vec::new() }
    }

    fn unsupported(&mut self, span: Span, what: &str, hint: &str) {
        self.errors.push(syn::Error::new(
            span,
            format!("unsupported in a Tessera kernel: {what}; {hint}"),
        ));
    }

    fn check_macro(&mut self, mac: &syn::Macro) {
        let name = mac
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        if !ALLOWED_MACROS.contains(&name.as_str()) {
            self.errors.push(syn::Error::new(
                mac.path.span(),
                format!(
                    "unsupported in a Tessera kernel: the macro `{name}!`; kernels may use \
                     only comptime macros ({})",
                    ALLOWED_MACROS.join("!, ") + "!"
                ),
            ));
        }
    }
}

impl VisitMut for Rewriter {
    fn visit_stmt_mut(&mut self, s: &mut Stmt) {
        match s {
            Stmt::Item(item) => match item {
                syn::Item::Const(_) | syn::Item::Use(_) => {}
                other => self.errors.push(syn::Error::new(
                    other.span(),
                    "unsupported in a Tessera kernel: items inside the body; move it out \
                     (mark functions called from kernels with #[helper])",
                )),
            },
            Stmt::Local(local) => {
                if let Some(init) = &local.init
                    && let Some((else_tok, _)) = &init.diverge
                {
                    self.unsupported(else_tok.span, "`let ... else`", "use `if` instead");
                }
            }
            Stmt::Macro(m) => self.check_macro(&m.mac),
            Stmt::Expr(..) => {}
        }
        visit_mut::visit_stmt_mut(self, s);
    }

    fn visit_expr_mut(&mut self, e: &mut Expr) {
        match e {
            Expr::Loop(l) => self.unsupported(
                l.loop_token.span,
                "`loop`",
                "write `while COND { .. }` with an explicit condition",
            ),
            Expr::Break(b) => self.unsupported(
                b.break_token.span,
                "`break`",
                "loops run to their bounds; use a `while` loop with a condition",
            ),
            Expr::Continue(c) => self.unsupported(
                c.continue_token.span,
                "`continue`",
                "guard the rest of the body with `if` instead",
            ),
            Expr::Return(r) => self.unsupported(
                r.return_token.span,
                "`return`",
                "kernels return nothing; guard the rest of the body with `if`",
            ),
            Expr::Match(m) => self.unsupported(
                m.match_token.span,
                "`match`",
                "use `if`/`else` (comptime or runtime) or `select`",
            ),
            Expr::Closure(c) => self.unsupported(
                c.or1_token.span,
                "closures",
                "write a function marked #[helper] and call it",
            ),
            Expr::Async(a) => self.unsupported(a.async_token.span, "`async`", "remove it"),
            Expr::Await(a) => self.unsupported(a.await_token.span, "`.await`", "remove it"),
            Expr::Try(t) => self.unsupported(
                t.question_token.span,
                "the `?` operator",
                "kernels cannot fail at run time",
            ),
            Expr::TryBlock(t) => self.unsupported(t.try_token.span, "`try` blocks", "remove it"),
            Expr::Yield(y) => self.unsupported(y.yield_token.span, "`yield`", "remove it"),
            Expr::Unsafe(u) => self.unsupported(
                u.unsafe_token.span,
                "`unsafe` blocks",
                "kernel code is checked and never needs `unsafe`",
            ),
            Expr::Let(l) => self.unsupported(
                l.let_token.span,
                "`if let` / `while let`",
                "compare with `.eq(..)` and branch on the result",
            ),
            Expr::Macro(m) => self.check_macro(&m.mac),
            Expr::Block(b) if b.label.is_some() => {
                self.unsupported(b.span(), "labeled blocks", "remove the label")
            }
            Expr::While(w) if w.label.is_some() => {
                self.unsupported(w.span(), "loop labels", "remove the label")
            }
            Expr::ForLoop(f) if f.label.is_some() => {
                self.unsupported(f.span(), "loop labels", "remove the label")
            }
            _ => {}
        }
        match e {
            Expr::If(_) | Expr::While(_) => {
                let carried = carried_vars(e);
                visit_mut::visit_expr_mut(self, e);
                *e = match e {
                    Expr::If(i) => rewrite_if(i, &carried),
                    Expr::While(w) => rewrite_while(w, &carried),
                    _ => unreachable!("matched above"),
                };
            }
            Expr::ForLoop(f) if range_bounds(&f.expr).is_some() => {
                let carried = carried_vars(e);
                visit_mut::visit_expr_mut(self, e);
                if let Expr::ForLoop(f) = e
                    && let Some(bounds) = range_bounds(&f.expr)
                {
                    *e = rewrite_for(f, bounds, &carried);
                }
            }
            Expr::Binary(b) if ord_op(&b.op).is_some() => {
                visit_mut::visit_expr_mut(self, e);
                if let Expr::Binary(b) = e
                    && let Some(op) = ord_op(&b.op)
                {
                    let (l, r) = (&b.left, &b.right);
                    let span = b.op.span();
                    // `compare` takes references, as the operator does; its trait bound
                    // turns a comparison of tiles into an error naming `.lt(..)` etc.
                    *e = syn::parse_quote_spanned! {span=>
                        ::tessera::__private::compare(
                            ::tessera::__private::OrdOp::#op, &(#l), &(#r))
                    };
                }
            }
            _ => visit_mut::visit_expr_mut(self, e),
        }
    }

    // Constant contexts stay as written: a `const` item, an array length or a const
    // generic argument may compare with `<`, which `compare` (not a `const fn`) cannot.
    fn visit_item_const_mut(&mut self, _: &mut syn::ItemConst) {}
    fn visit_expr_const_mut(&mut self, _: &mut syn::ExprConst) {}
    fn visit_type_mut(&mut self, _: &mut syn::Type) {}
    fn visit_generic_argument_mut(&mut self, _: &mut syn::GenericArgument) {}
    fn visit_expr_repeat_mut(&mut self, r: &mut syn::ExprRepeat) {
        self.visit_expr_mut(&mut r.expr);
    }
}

/// The [`OrdOp`] variant for `<`, `<=`, `>`, `>=`.
fn ord_op(op: &BinOp) -> Option<Ident> {
    let name = match op {
        BinOp::Lt(_) => "Lt",
        BinOp::Le(_) => "Le",
        BinOp::Gt(_) => "Gt",
        BinOp::Ge(_) => "Ge",
        _ => return None,
    };
    Some(Ident::new(name, op.span()))
}

/// The variables assigned inside `e` that are declared outside it, in order of first
/// assignment.
fn carried_vars(e: &Expr) -> Vec<Ident> {
    let mut a = Assigned::default();
    a.visit_expr(e);
    let mut seen = HashSet::new();
    a.assigned
        .into_iter()
        .filter(|i| !a.declared.contains(&i.to_string()))
        .filter(|i| seen.insert(i.to_string()))
        .collect()
}

#[derive(Default)]
struct Assigned {
    assigned: Vec<Ident>,
    declared: HashSet<String>,
}

impl Assigned {
    fn place(&mut self, e: &Expr) {
        match e {
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
                self.assigned.push(p.path.segments[0].ident.clone());
            }
            Expr::Field(f) => self.place(&f.base),
            Expr::Index(i) => self.place(&i.expr),
            Expr::Paren(p) => self.place(&p.expr),
            Expr::Tuple(t) => t.elems.iter().for_each(|e| self.place(e)),
            Expr::Array(a) => a.elems.iter().for_each(|e| self.place(e)),
            _ => {}
        }
    }

    fn declare(&mut self, p: &Pat) {
        struct Binder<'a>(&'a mut HashSet<String>);
        impl Visit<'_> for Binder<'_> {
            fn visit_pat_ident(&mut self, i: &syn::PatIdent) {
                self.0.insert(i.ident.to_string());
                visit::visit_pat_ident(self, i);
            }
        }
        Binder(&mut self.declared).visit_pat(p);
    }
}

impl Visit<'_> for Assigned {
    fn visit_expr_assign(&mut self, a: &syn::ExprAssign) {
        self.place(&a.left);
        visit::visit_expr_assign(self, a);
    }
    fn visit_expr_binary(&mut self, b: &syn::ExprBinary) {
        if matches!(
            b.op,
            BinOp::AddAssign(_)
                | BinOp::SubAssign(_)
                | BinOp::MulAssign(_)
                | BinOp::DivAssign(_)
                | BinOp::RemAssign(_)
                | BinOp::BitAndAssign(_)
                | BinOp::BitOrAssign(_)
                | BinOp::BitXorAssign(_)
                | BinOp::ShlAssign(_)
                | BinOp::ShrAssign(_)
        ) {
            self.place(&b.left);
        }
        visit::visit_expr_binary(self, b);
    }
    fn visit_local(&mut self, l: &syn::Local) {
        self.declare(&l.pat);
        visit::visit_local(self, l);
    }
    fn visit_expr_for_loop(&mut self, f: &syn::ExprForLoop) {
        self.declare(&f.pat);
        visit::visit_expr_for_loop(self, f);
    }
}

/// `(start, end, step)` of `for` over `a..b`, `a..=b`, or `(a..b).step_by(s)`.
fn range_bounds(e: &Expr) -> Option<(TokenStream, TokenStream, TokenStream)> {
    fn strip(e: &Expr) -> &Expr {
        match e {
            Expr::Paren(p) => strip(&p.expr),
            Expr::Group(g) => strip(&g.expr),
            e => e,
        }
    }
    let one = |span: Span| quote_spanned!(span=> 1);
    match strip(e) {
        Expr::Range(r) => {
            let start = r.start.as_ref()?;
            let end = r.end.as_ref()?;
            let end = match r.limits {
                syn::RangeLimits::HalfOpen(_) => quote!(#end),
                syn::RangeLimits::Closed(_) => quote!((#end) + 1),
            };
            Some((quote!(#start), end, one(r.span())))
        }
        Expr::MethodCall(m) if m.method == "step_by" && m.args.len() == 1 => {
            let (s, e, _) = range_bounds(&m.receiver)?;
            let step = &m.args[0];
            Some((s, e, quote!(#step)))
        }
        _ => None,
    }
}

fn internal(name: &str) -> Ident {
    format_ident!("__tessera_{}", name, span = Span::mixed_site())
}

/// `(a, b,)` and `["a", "b"]` for the carried variables.
fn vars_tokens(carried: &[Ident]) -> (TokenStream, TokenStream, TokenStream) {
    let names: Vec<String> = carried.iter().map(|i| i.to_string()).collect();
    let tuple = quote!((#(#carried,)*));
    let muts = quote!((#(mut #carried,)*));
    (tuple, muts, quote!(&[#(#names),*]))
}

fn assign_back(carried: &[Ident], from: &Ident) -> TokenStream {
    if carried.is_empty() {
        quote!()
    } else {
        quote!((#(#carried,)*) = #from;)
    }
}

fn rewrite_if(i: &syn::ExprIf, carried: &[Ident]) -> Expr {
    let (tuple, muts, names) = vars_tokens(carried);
    let vars = internal("vars");
    let branch = internal("branch");
    let r = internal("r");
    let cond = &i.cond;
    let then = &i.then_branch;
    let els = match &i.else_branch {
        Some((_, e)) => quote!(#e),
        None => quote!({}),
    };
    let back = assign_back(carried, &vars);
    let call = quote_spanned! {i.if_token.span=>
        ::tessera::__private::if_else(#cond, #tuple, #names, |#branch: bool, #vars| {
            let #muts = #vars;
            let #r = if #branch #then else #els;
            (#tuple, #r)
        })
    };
    syn::parse_quote! {{
        let (#vars, #r) = #call;
        #back
        #r
    }}
}

fn rewrite_for(
    f: &syn::ExprForLoop,
    (start, end, step): (TokenStream, TokenStream, TokenStream),
    carried: &[Ident],
) -> Expr {
    let (tuple, muts, names) = vars_tokens(carried);
    let vars = internal("vars");
    let pat = &f.pat;
    let body = &f.body;
    let back = assign_back(carried, &vars);
    let call = quote_spanned! {f.for_token.span=>
        ::tessera::__private::for_range((#start, #end, #step), #tuple, #names, |#pat, #vars| {
            let #muts = #vars;
            #body;
            #tuple
        })
    };
    syn::parse_quote! {{
        let #vars = #call;
        #back
    }}
}

fn rewrite_while(w: &syn::ExprWhile, carried: &[Ident]) -> Expr {
    let (tuple, muts, names) = vars_tokens(carried);
    let vars = internal("vars");
    let phase = internal("phase");
    let cond = &w.cond;
    let body = &w.body;
    let c = internal("c");
    let back = assign_back(carried, &vars);
    let call = quote_spanned! {w.while_token.span=>
        ::tessera::__private::while_loop(#tuple, #names, |#phase: bool, #vars| {
            let #muts = #vars;
            if #phase {
                let #c = ::tessera::ir::dsl::while_cond(#cond);
                (#tuple, ::core::option::Option::Some(#c))
            } else {
                #body;
                (#tuple, ::core::option::Option::None)
            }
        })
    };
    syn::parse_quote! {{
        let #vars = #call;
        #back
    }}
}

/// Names of `candidates` that appear inside generic argument lists (`::<..>`, `T<..>`)
/// in `tokens`: const generics used as tile dimensions.
pub fn used_in_generic_args(block: &syn::Block, candidates: &[Ident]) -> Vec<Ident> {
    let mut found: Vec<Ident> = Vec::new();
    for i in used_in_generic_args_all(block, candidates) {
        if !found.contains(&i) {
            found.push(i);
        }
    }
    found
}

/// Every occurrence (with its span) of `candidates` inside generic argument lists.
pub fn used_in_generic_args_all(block: &syn::Block, candidates: &[Ident]) -> Vec<Ident> {
    struct Finder<'a> {
        candidates: &'a [Ident],
        depth: usize,
        found: Vec<Ident>,
    }
    impl Visit<'_> for Finder<'_> {
        fn visit_angle_bracketed_generic_arguments(
            &mut self,
            a: &syn::AngleBracketedGenericArguments,
        ) {
            self.depth += 1;
            visit::visit_angle_bracketed_generic_arguments(self, a);
            self.depth -= 1;
        }
        fn visit_ident(&mut self, i: &Ident) {
            if self.depth > 0 && self.candidates.iter().any(|c| c == i) {
                self.found.push(i.clone());
            }
        }
    }
    let mut f = Finder {
        candidates,
        depth: 0,
        found: Vec::new(),
    };
    f.visit_block(block);
    f.found
}
