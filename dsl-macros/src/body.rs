//! Rewriting of kernel bodies: control flow becomes calls into the tracing front-end,
//! unsupported syntax becomes a compile error at its span.

use std::collections::HashSet;

use proc_macro2::{Spacing, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
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
        } else {
            self.check_macro_args(&name, mac.tokens.clone(), true);
        }
    }

    /// Macro arguments are opaque to the rewrite: they run as plain Rust while the
    /// kernel is built. Control flow there would escape the tracing (`return` ends the
    /// build early, silently dropping the rest of the kernel) and an assignment there
    /// would not be carried through `if`/`for`/`while`: reject them at their span.
    /// `mac` is the innermost macro whose arguments `tokens` are in, `top` whether they
    /// are its top level (not inside a group of its arguments).
    fn check_macro_args(&mut self, mac: &str, tokens: TokenStream, top: bool) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        // Inside `let PAT = ..` up to its `=`, which is no assignment.
        let mut in_let = false;
        // Commas so far at this level (the macro's arguments before, when `top`).
        let mut commas = 0;
        for (i, t) in tokens.iter().enumerate() {
            match t {
                TokenTree::Group(g) => {
                    // The arguments of a nested macro call `name!(..)`: its own top level.
                    let nested = macro_called(&tokens, i);
                    match nested {
                        Some(name) => self.check_macro_args(&name, g.stream(), true),
                        None => self.check_macro_args(mac, g.stream(), false),
                    }
                }
                TokenTree::Ident(id) => {
                    let word = id.to_string();
                    in_let |= word == "let";
                    if MACRO_ARG_KEYWORDS.contains(&word.as_str()) {
                        self.errors.push(syn::Error::new(
                            id.span(),
                            format!(
                                "unsupported in a Tessera kernel: `{word}` inside the \
                                 arguments of `{mac}!`; macro arguments run as plain Rust \
                                 while the kernel is built, outside the tracing of control \
                                 flow; compute the value with a `let` before the macro"
                            ),
                        ));
                    }
                    // A nested macro call: `name!(..)`.
                    if let (Some(TokenTree::Punct(bang)), Some(TokenTree::Group(_))) =
                        (tokens.get(i + 1), tokens.get(i + 2))
                        && bang.as_char() == '!'
                        && !MACRO_ARG_KEYWORDS.contains(&word.as_str())
                        && !NOT_MACROS.contains(&word.as_str())
                        && !ALLOWED_MACROS.contains(&word.as_str())
                    {
                        self.errors.push(syn::Error::new(
                            id.span(),
                            format!(
                                "unsupported in a Tessera kernel: the macro `{word}!`; \
                                 kernels may use only comptime macros ({})",
                                ALLOWED_MACROS.join("!, ") + "!"
                            ),
                        ));
                    }
                }
                TokenTree::Punct(p) if p.as_char() == ',' => commas += 1,
                TokenTree::Punct(p) if p.as_char() == '?' => self.errors.push(syn::Error::new(
                    p.span(),
                    format!(
                        "unsupported in a Tessera kernel: the `?` operator inside the \
                         arguments of `{mac}!`; kernels cannot fail at run time"
                    ),
                )),
                TokenTree::Punct(p) if p.as_char() == '=' && p.spacing() == Spacing::Alone => {
                    // The operator ending here: the joint punctuation before it, and `=`.
                    let mut op = String::from("=");
                    let mut j = i;
                    while j > 0
                        && let Some(TokenTree::Punct(q)) = tokens.get(j - 1)
                        && q.spacing() == Spacing::Joint
                    {
                        op.insert(0, q.as_char());
                        j -= 1;
                    }
                    let assign = ASSIGN_OPS.contains(&op.as_str());
                    // `, name = value` at the top level of a format-style macro, after
                    // its format string: a named format argument.
                    let named_arg = op == "="
                        && top
                        && i >= 2
                        && matches!(&tokens[i - 1], TokenTree::Ident(_))
                        && matches!(&tokens[i - 2], TokenTree::Punct(c) if c.as_char() == ',')
                        && FORMAT_MACROS
                            .iter()
                            .any(|(m, before)| *m == mac && commas >= *before);
                    let binding = op == "=" && std::mem::take(&mut in_let);
                    if assign && !named_arg && !binding {
                        self.errors.push(syn::Error::new(
                            p.span(),
                            format!(
                                "unsupported in a Tessera kernel: an assignment (`{op}`) \
                                 inside the arguments of `{mac}!`; it would not be passed \
                                 through `if`/`for`/`while`; assign before the macro"
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
    }
}

/// Words before `!` that are no macro name (`if !x {..}`).
const NOT_MACROS: &[&str] = &["if", "else", "in", "as", "mut", "move"];

/// The name of the macro whose arguments `tokens[i]` (a group) are: `name!(..)`.
fn macro_called(tokens: &[TokenTree], i: usize) -> Option<String> {
    let (TokenTree::Ident(name), TokenTree::Punct(bang)) =
        (tokens.get(i.checked_sub(2)?)?, tokens.get(i - 1)?)
    else {
        return None;
    };
    let name = name.to_string();
    (bang.as_char() == '!'
        && !MACRO_ARG_KEYWORDS.contains(&name.as_str())
        && !NOT_MACROS.contains(&name.as_str()))
    .then_some(name)
}

/// Macros taking a format string and named arguments (`name = value`), with the number
/// of their arguments up to and including the format string (which the named
/// arguments follow): `assert_eq!(a, b, "{x}", x = ..)`.
const FORMAT_MACROS: &[(&str, usize)] = &[
    ("println", 1),
    ("eprintln", 1),
    ("print", 1),
    ("eprint", 1),
    ("format", 1),
    ("panic", 1),
    ("unreachable", 1),
    ("write", 2),
    ("writeln", 2),
    ("assert", 2),
    ("debug_assert", 2),
    ("assert_eq", 3),
    ("assert_ne", 3),
    ("debug_assert_eq", 3),
    ("debug_assert_ne", 3),
];

/// Keywords rejected inside the arguments of the allowed macros.
const MACRO_ARG_KEYWORDS: &[&str] = &[
    "return", "break", "continue", "loop", "match", "while", "for", "async", "await", "yield",
    "unsafe", "become",
];

/// Assignment operators (`=` and the compound ones).
const ASSIGN_OPS: &[&str] = &[
    "=", "+=", "-=", "*=", "/=", "%=", "^=", "&=", "|=", "<<=", ">>=",
];

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
                let ch = changes(e);
                visit_mut::visit_expr_mut(self, e);
                match e {
                    Expr::If(i) => *e = rewrite_if(i, &ch),
                    Expr::While(w) => *e = rewrite_while(w, &ch),
                    _ => {}
                }
            }
            Expr::ForLoop(f) if range_bounds(&f.expr).is_some() => {
                let ch = changes(e);
                visit_mut::visit_expr_mut(self, e);
                if let Expr::ForLoop(f) = e
                    && let Some(bounds) = range_bounds(&f.expr)
                {
                    *e = rewrite_for(f, bounds, &ch);
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

    fn visit_attribute_mut(&mut self, a: &mut syn::Attribute) {
        if a.path().is_ident("comptime") || a.path().is_ident("no_specialize") {
            self.errors.push(syn::Error::new_spanned(
                &*a,
                "`#[comptime]` and `#[no_specialize]` mark kernel parameters \
                 (`#[comptime] name: T`); inside the body, a value computed from comptime \
                 values is comptime already",
            ));
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

/// Methods of Rust's standard types (and the `op=` traits) that change their receiver
/// in place (not `sort`, which tiles have by value). Inside a construct, a call of one
/// on a variable declared outside it is a change the macro cannot carry: a runtime
/// construct rejects it when it is traced.
const MUTATING_METHODS: &[&str] = &[
    "push",
    "push_str",
    "push_back",
    "push_front",
    "pop",
    "pop_back",
    "pop_front",
    "insert",
    "remove",
    "swap_remove",
    "clear",
    "extend",
    "extend_from_slice",
    "append",
    "truncate",
    "resize",
    "retain",
    "drain",
    "dedup",
    "sort_by",
    "sort_by_key",
    "sort_unstable",
    "reverse",
    "swap",
    "fill",
    "rotate_left",
    "rotate_right",
    "get_mut",
    "iter_mut",
    "entry",
    "add_assign",
    "sub_assign",
    "mul_assign",
    "div_assign",
    "rem_assign",
    "bitand_assign",
    "bitor_assign",
    "bitxor_assign",
    "shl_assign",
    "shr_assign",
];

/// What a construct changes of the variables declared outside it.
pub struct Changes {
    /// Variables assigned (`x = ..`, `x += ..`, `x.f = ..`, `x[i] = ..`), in order of
    /// first assignment: passed in and out of the construct.
    pub carried: Vec<Ident>,
    /// Changes the macro cannot pass through (`v.push(..)`, `*r = ..`): a description
    /// and its span; a runtime construct rejects them when traced.
    pub opaque: Vec<(String, Span)>,
}

/// The variables that `e` (an `if`, `while` or `for`) changes and that are declared
/// outside it. Scope-aware: an assignment inside refers to the outer variable unless a
/// `let` or `for` pattern binding that name earlier in an enclosing block of `e` shadows
/// it.
fn changes(e: &Expr) -> Changes {
    let mut a = Assigned::default();
    a.visit_expr(e);
    let mut seen = HashSet::new();
    Changes {
        carried: a
            .assigned
            .into_iter()
            .filter(|i| seen.insert(i.to_string()))
            .collect(),
        opaque: a.opaque,
    }
}

#[derive(Default)]
struct Assigned {
    /// Names bound inside the construct, one set per open scope (block, `for` body).
    scopes: Vec<HashSet<String>>,
    assigned: Vec<Ident>,
    opaque: Vec<(String, Span)>,
}

/// `e` as the user wrote it, roughly (`*r`, `self.v`), for messages.
fn source_text(e: &Expr) -> String {
    e.to_token_stream()
        .to_string()
        .replace(" . ", ".")
        .replace("* ", "*")
        .replace("& ", "&")
}

/// The variable a place expression (`v`, `v.f`, `v[i]`, `*v`, `v.m()`) starts from.
fn root(e: &Expr) -> Option<&Ident> {
    match e {
        Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
            Some(&p.path.segments[0].ident)
        }
        Expr::Field(f) => root(&f.base),
        Expr::Index(i) => root(&i.expr),
        Expr::Paren(p) => root(&p.expr),
        Expr::Group(g) => root(&g.expr),
        Expr::Unary(u) => root(&u.expr),
        Expr::MethodCall(m) => root(&m.receiver),
        Expr::Reference(r) => root(&r.expr),
        _ => None,
    }
}

impl Assigned {
    /// True if `name` is bound inside the construct at this point.
    fn is_local(&self, name: &Ident) -> bool {
        let name = name.to_string();
        self.scopes.iter().any(|s| s.contains(&name))
    }

    /// The target of an assignment: a place, or (`=`) a destructuring pattern of
    /// places: `(a, b)`, `[a, b]`, `S { a, b: c.f, .. }`, `P(a, _)`, nested.
    fn place(&mut self, e: &Expr, op: &str) {
        match e {
            Expr::Paren(p) => self.place(&p.expr, op),
            Expr::Group(g) => self.place(&g.expr, op),
            Expr::Tuple(t) => t.elems.iter().for_each(|e| self.place(e, op)),
            Expr::Array(a) => a.elems.iter().for_each(|e| self.place(e, op)),
            Expr::Struct(s) => s.fields.iter().for_each(|f| self.place(&f.expr, op)),
            Expr::Call(c) => c.args.iter().for_each(|e| self.place(e, op)),
            // `_` and the `..` of `(a, ..)` assign nothing.
            Expr::Infer(_) | Expr::Range(_) => {}
            e => self.place_expr(e, op),
        }
    }

    /// A place expression: `v`, `v.f`, `v[i]` change `v`; `*r`, `*v.last_mut().unwrap()`
    /// change something through a reference.
    fn place_expr(&mut self, e: &Expr, op: &str) {
        match e {
            Expr::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
                let i = &p.path.segments[0].ident;
                if !self.is_local(i) {
                    self.assigned.push(i.clone());
                }
            }
            Expr::Field(f) => self.place_expr(&f.base, op),
            Expr::Index(i) => self.place_expr(&i.expr, op),
            Expr::Paren(p) => self.place_expr(&p.expr, op),
            Expr::Group(g) => self.place_expr(&g.expr, op),
            other => {
                if let Some(r) = root(other)
                    && !self.is_local(r)
                {
                    let place = source_text(other);
                    self.opaque.push((
                        format!("`{place} {op} ..` (through a reference)"),
                        other.span(),
                    ));
                }
            }
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
        if self.scopes.is_empty() {
            self.scopes.push(HashSet::new());
        }
        if let Some(top) = self.scopes.last_mut() {
            Binder(top).visit_pat(p);
        }
    }
}

impl Visit<'_> for Assigned {
    fn visit_block(&mut self, b: &syn::Block) {
        self.scopes.push(HashSet::new());
        visit::visit_block(self, b);
        self.scopes.pop();
    }
    fn visit_expr_assign(&mut self, a: &syn::ExprAssign) {
        self.place(&a.left, "=");
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
            let op = b.op.to_token_stream().to_string();
            self.place(&b.left, &op);
        }
        visit::visit_expr_binary(self, b);
    }
    fn visit_expr_method_call(&mut self, m: &syn::ExprMethodCall) {
        let name = m.method.to_string();
        if MUTATING_METHODS.contains(&name.as_str())
            && let Some(r) = root(&m.receiver)
            && !self.is_local(r)
        {
            let recv = source_text(&m.receiver);
            self.opaque
                .push((format!("`{recv}.{name}(..)`"), m.method.span()));
        }
        visit::visit_expr_method_call(self, m);
    }
    fn visit_local(&mut self, l: &syn::Local) {
        // The initializer sees the bindings before this `let`.
        if let Some(init) = &l.init {
            self.visit_expr(&init.expr);
            if let Some((_, e)) = &init.diverge {
                self.visit_expr(e);
            }
        }
        self.declare(&l.pat);
    }
    fn visit_expr_for_loop(&mut self, f: &syn::ExprForLoop) {
        self.visit_expr(&f.expr);
        self.scopes.push(HashSet::new());
        self.declare(&f.pat);
        self.visit_block(&f.body);
        self.scopes.pop();
    }
    fn visit_expr_closure(&mut self, c: &syn::ExprClosure) {
        self.scopes.push(HashSet::new());
        c.inputs.iter().for_each(|p| self.declare(p));
        self.visit_expr(&c.body);
        self.scopes.pop();
    }
    fn visit_arm(&mut self, arm: &syn::Arm) {
        self.scopes.push(HashSet::new());
        self.declare(&arm.pat);
        if let Some((_, g)) = &arm.guard {
            self.visit_expr(g);
        }
        self.visit_expr(&arm.body);
        self.scopes.pop();
    }
    // Items cannot see the construct's variables.
    fn visit_item(&mut self, _: &syn::Item) {}
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

/// `(a, b,)`, `(mut a, mut b,)`, `&["a", "b"]` for the carried variables, and the
/// changes the macro cannot carry, each `(description, line, column)` at its span.
fn vars_tokens(ch: &Changes) -> (TokenStream, TokenStream, TokenStream, TokenStream) {
    let carried = &ch.carried;
    let names: Vec<String> = carried.iter().map(|i| i.to_string()).collect();
    let tuple = quote!((#(#carried,)*));
    let muts = quote!((#(mut #carried,)*));
    let opaque = ch
        .opaque
        .iter()
        .map(|(what, span)| quote_spanned!(*span=> (#what, ::core::line!(), ::core::column!())));
    (tuple, muts, quote!(&[#(#names),*]), quote!(&[#(#opaque),*]))
}

fn assign_back(carried: &[Ident], from: &Ident) -> TokenStream {
    if carried.is_empty() {
        quote!()
    } else {
        quote!((#(#carried,)*) = #from;)
    }
}

fn rewrite_if(i: &syn::ExprIf, ch: &Changes) -> Expr {
    let carried = &ch.carried;
    let (tuple, muts, names, opaque) = vars_tokens(ch);
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
        ::tessera::__private::if_else(#cond, #tuple, #names, #opaque, |#branch: bool, #vars| {
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
    ch: &Changes,
) -> Expr {
    let carried = &ch.carried;
    let (tuple, muts, names, opaque) = vars_tokens(ch);
    let vars = internal("vars");
    let pat = &f.pat;
    let body = &f.body;
    let back = assign_back(carried, &vars);
    let call = quote_spanned! {f.for_token.span=>
        ::tessera::__private::for_range((#start, #end, #step), #tuple, #names, #opaque, |#pat, #vars| {
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

fn rewrite_while(w: &syn::ExprWhile, ch: &Changes) -> Expr {
    let carried = &ch.carried;
    let (tuple, muts, names, opaque) = vars_tokens(ch);
    let vars = internal("vars");
    let phase = internal("phase");
    let cond = &w.cond;
    let body = &w.body;
    let c = internal("c");
    let back = assign_back(carried, &vars);
    let call = quote_spanned! {w.while_token.span=>
        ::tessera::__private::while_loop(#tuple, #names, #opaque, |#phase: bool, #vars| {
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
