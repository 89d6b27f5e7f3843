//! Expansion of `#[kernel]` and `#[helper]`.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{FnArg, GenericParam, Ident, ItemFn, Pat, Type};

use crate::body::{Rewriter, used_in_generic_args, used_in_generic_args_all};

enum ParamKind {
    /// `&Global<T>` or `&mut Global<T>` (`symmetric`: `&Symmetric<T>`, `&mut ...`).
    Buffer {
        mutable: bool,
        elem: Type,
        symmetric: bool,
    },
    /// `&TensorDesc<T, S>` or `&mut TensorDesc<T, S>`.
    Desc {
        mutable: bool,
        elem: Type,
        shape: Box<Type>,
    },
    /// `&X` or `&mut X` for another path `X`, such as a type alias of a buffer
    /// (`type Buf = Global<f32>`): declared and passed through `RefParam`, which the
    /// kernel-side buffer and descriptor types implement.
    Aliased { mutable: bool, inner: Type },
    /// A runtime scalar.
    Scalar(Type),
    /// `#[comptime]`.
    Comptime(Type),
}

struct Param {
    name: Ident,
    /// `mut name: T`: the binding inside the kernel body is mutable.
    mutable: bool,
    kind: ParamKind,
    /// `#[no_specialize]`: launches record no facts about the value.
    no_specialize: bool,
    /// The declared type, as written.
    ty: Type,
}

fn errors_to_tokens(errors: Vec<syn::Error>) -> TokenStream {
    let mut ts = TokenStream::new();
    for e in errors {
        ts.extend(e.to_compile_error());
    }
    ts
}

/// `Global<T>` or `Symmetric<T>` behind a reference: the element type, and whether
/// the buffer is symmetric.
fn global_elem(ty: &Type) -> Option<(Type, bool)> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    let symmetric = seg.ident == "Symmetric";
    if seg.ident != "Global" && !symmetric {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &seg.arguments else {
        return None;
    };
    match args.args.first() {
        Some(syn::GenericArgument::Type(t)) if args.args.len() == 1 => Some((t.clone(), symmetric)),
        _ => None,
    }
}

/// Rust's primitive types and `String`: a reference to one is no kernel parameter
/// (and no alias of a buffer).
const PRIMITIVES: &[&str] = &[
    "bool", "char", "str", "String", "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16",
    "u32", "u64", "u128", "usize", "f16", "bf16", "f32", "f64",
];

/// `X` in `&X` names a type that may be an alias of a buffer or a descriptor: a path
/// (`Buf`, `my::Buf<T>`) that is not a primitive type.
fn maybe_alias(ty: &Type) -> bool {
    let Type::Path(p) = ty else { return false };
    p.qself.is_none()
        && p.path
            .segments
            .last()
            .is_some_and(|s| !PRIMITIVES.iter().any(|prim| s.ident == prim))
}

/// Whether `ty` mentions any of `names` (type parameters).
fn mentions(ty: &Type, names: &[&Ident]) -> bool {
    fn walk(ts: TokenStream, names: &[&Ident]) -> bool {
        ts.into_iter().any(|t| match t {
            proc_macro2::TokenTree::Ident(i) => names.iter().any(|n| **n == i),
            proc_macro2::TokenTree::Group(g) => walk(g.stream(), names),
            _ => false,
        })
    }
    walk(quote!(#ty), names)
}

/// Rewrites each use of a const generic as a bare generic argument (`S1<D>`,
/// `arange::<D>()`) into a braced one (`S1<{ D }>`), which Rust reads as the constant
/// even when a type of that name is in scope: a kernel's `const D: usize` would
/// otherwise be the prelude's dimension type `D` there ("type provided when a constant
/// was expected").
struct BraceConsts<'a> {
    consts: &'a [Ident],
}

impl VisitMut for BraceConsts<'_> {
    fn visit_generic_argument_mut(&mut self, a: &mut syn::GenericArgument) {
        if let syn::GenericArgument::Type(Type::Path(tp)) = a
            && tp.qself.is_none()
            && tp.path.leading_colon.is_none()
            && tp.path.segments.len() == 1
            && matches!(tp.path.segments[0].arguments, syn::PathArguments::None)
            && self.consts.contains(&tp.path.segments[0].ident)
        {
            let id = tp.path.segments[0].ident.clone();
            *a = syn::GenericArgument::Const(syn::parse_quote_spanned!(id.span()=> { #id }));
            return;
        }
        syn::visit_mut::visit_generic_argument_mut(self, a);
    }
}

/// The names of `f`'s const generics.
fn const_generics(f: &ItemFn) -> Vec<Ident> {
    f.sig
        .generics
        .const_params()
        .map(|c| c.ident.clone())
        .collect()
}

/// Braces every use of `f`'s const generics as a generic argument, in its signature
/// and body (see [`BraceConsts`]).
fn brace_const_generics(f: &mut ItemFn) {
    let consts = const_generics(f);
    if consts.is_empty() {
        return;
    }
    let mut v = BraceConsts { consts: &consts };
    if let Some(w) = &mut f.sig.generics.where_clause {
        v.visit_where_clause_mut(w);
    }
    for a in &mut f.sig.inputs {
        v.visit_fn_arg_mut(a);
    }
    v.visit_return_type_mut(&mut f.sig.output);
    v.visit_block_mut(&mut f.block);
}

/// `S2<N, 1>` and `S3<.., 1, ..>` in a helper's signature: the user means the size-1
/// axis that `expand_dims` and the `*_keepdims` reductions make, which is `One`, while
/// `S2<N, 1>` is `(D<N>, D<1>)`. Rejected with the right spelling, rather than a type
/// mismatch against `(D<N>, One)` at the call and a shape mismatch inside.
fn check_size1_shapes(f: &ItemFn, errors: &mut Vec<syn::Error>) {
    struct Finder<'a> {
        errors: &'a mut Vec<syn::Error>,
    }
    impl syn::visit::Visit<'_> for Finder<'_> {
        fn visit_type_path(&mut self, tp: &syn::TypePath) {
            if let Some(seg) = tp.path.segments.last()
                && (seg.ident == "S2" || seg.ident == "S3")
                && let syn::PathArguments::AngleBracketed(args) = &seg.arguments
            {
                let is_one = |a: &syn::GenericArgument| {
                    matches!(a, syn::GenericArgument::Const(syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Int(i), ..
                    })) if i.base10_digits() == "1")
                };
                if args.args.iter().any(is_one) {
                    let dims: Vec<String> = args
                        .args
                        .iter()
                        .map(|a| {
                            if is_one(a) {
                                "One".to_string()
                            } else {
                                format!("D<{}>", quote!(#a))
                            }
                        })
                        .collect();
                    let plain: Vec<String> = args
                        .args
                        .iter()
                        .map(|a| format!("D<{}>", quote!(#a)))
                        .collect();
                    let args_written: Vec<String> =
                        args.args.iter().map(|a| quote!(#a).to_string()).collect();
                    let written = format!("{}<{}>", seg.ident, args_written.join(", "));
                    self.errors.push(syn::Error::new_spanned(
                        tp,
                        format!(
                            "a size-1 axis that broadcasts is `One`: write `({})` here. `{written}` is \
                             `({})`, whose `D<1>` is a dimension of size 1 that does not \
                             broadcast and is not what `expand_dims` and the `*_keepdims` \
                             reductions make (write `({})` if you mean it)",
                            dims.join(", "),
                            plain.join(", "),
                            plain.join(", "),
                        ),
                    ));
                    return;
                }
            }
            syn::visit::visit_type_path(self, tp);
        }
    }
    let mut v = Finder { errors };
    for a in &f.sig.inputs {
        syn::visit::Visit::visit_fn_arg(&mut v, a);
    }
    syn::visit::Visit::visit_return_type(&mut v, &f.sig.output);
}

/// `<A, T, { N }>`: the generics of `f` as arguments, consts braced (see
/// [`BraceConsts`]).
fn type_args(generics: &syn::Generics) -> TokenStream {
    if generics.params.is_empty() {
        return TokenStream::new();
    }
    let args = generics.params.iter().map(|p| match p {
        GenericParam::Lifetime(l) => {
            let l = &l.lifetime;
            quote!(#l)
        }
        GenericParam::Type(t) => {
            let i = &t.ident;
            quote!(#i)
        }
        GenericParam::Const(c) => {
            let i = &c.ident;
            quote_spanned!(i.span()=> { #i })
        }
    });
    quote!(<#(#args),*>)
}

/// `TensorDesc<T, S>`: the element type and the block shape.
fn desc_parts(ty: &Type) -> Option<(Type, Type)> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    if seg.ident != "TensorDesc" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &seg.arguments else {
        return None;
    };
    match (args.args.first(), args.args.get(1)) {
        (Some(syn::GenericArgument::Type(t)), Some(syn::GenericArgument::Type(s)))
            if args.args.len() == 2 =>
        {
            Some((t.clone(), s.clone()))
        }
        _ => None,
    }
}

fn parse_params(f: &mut ItemFn, errors: &mut Vec<syn::Error>) -> Vec<Param> {
    let mut params = Vec::new();
    for arg in f.sig.inputs.iter_mut() {
        let pt = match arg {
            FnArg::Receiver(r) => {
                errors.push(syn::Error::new(
                    r.span(),
                    "a kernel cannot take `self`; kernels are free functions",
                ));
                continue;
            }
            FnArg::Typed(pt) => pt,
        };
        let mut comptime = false;
        let mut no_specialize = None;
        for a in std::mem::take(&mut pt.attrs) {
            let known = a.path().is_ident("comptime") || a.path().is_ident("no_specialize");
            if !known {
                errors.push(syn::Error::new_spanned(
                    &a,
                    "unsupported attribute on a kernel parameter: parameters take only \
                     `#[comptime]` (a value known at launch) or `#[no_specialize]` (a runtime \
                     scalar launches do not specialize on)",
                ));
            } else if !matches!(a.meta, syn::Meta::Path(_)) {
                errors.push(syn::Error::new(
                    a.meta.span(),
                    "`#[comptime]` and `#[no_specialize]` take no arguments",
                ));
            } else if a.path().is_ident("comptime") {
                comptime = true;
            } else {
                no_specialize = Some(a.path().span());
            }
        }
        let (name, mutable) = match &*pt.pat {
            Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
                (pi.ident.clone(), pi.mutability.is_some())
            }
            other => {
                errors.push(syn::Error::new(
                    other.span(),
                    "kernel parameters must be plain names",
                ));
                continue;
            }
        };
        let ty = (*pt.ty).clone();
        let kind = if comptime {
            ParamKind::Comptime(ty.clone())
        } else if let Type::Reference(r) = &ty
            && let Some((elem, shape)) = desc_parts(&r.elem)
        {
            if r.lifetime.is_some() {
                errors.push(syn::Error::new(
                    r.span(),
                    "kernel descriptor parameters take no lifetime",
                ));
            }
            ParamKind::Desc {
                mutable: r.mutability.is_some(),
                elem,
                shape: Box::new(shape),
            }
        } else if let Type::Reference(r) = &ty {
            match global_elem(&r.elem) {
                Some((elem, symmetric)) => {
                    if r.lifetime.is_some() {
                        errors.push(syn::Error::new(
                            r.span(),
                            "kernel buffer parameters take no lifetime",
                        ));
                    }
                    ParamKind::Buffer {
                        mutable: r.mutability.is_some(),
                        elem,
                        symmetric,
                    }
                }
                None if maybe_alias(&r.elem) => {
                    if r.lifetime.is_some() {
                        errors.push(syn::Error::new(
                            r.span(),
                            "kernel buffer parameters take no lifetime",
                        ));
                    }
                    ParamKind::Aliased {
                        mutable: r.mutability.is_some(),
                        inner: (*r.elem).clone(),
                    }
                }
                None => {
                    errors.push(syn::Error::new(
                        ty.span(),
                        "unsupported kernel parameter type: references are only allowed to \
                         buffers (`&Global<T>`, `&mut Global<T>`, `&Symmetric<T>` or \
                         `&mut Symmetric<T>`) and tensor descriptors (`&TensorDesc<T, S>`, \
                         `&mut TensorDesc<T, S>`)",
                    ));
                    continue;
                }
            }
        } else if desc_parts(&ty).is_some() {
            errors.push(syn::Error::new(
                ty.span(),
                "take descriptors by reference: `&TensorDesc<T, S>` (read-only) or `&mut TensorDesc<T, S>`",
            ));
            continue;
        } else if global_elem(&ty).is_some() {
            errors.push(syn::Error::new(
                ty.span(),
                "take buffers by reference: `&Global<T>` (read-only) or `&mut Global<T>`",
            ));
            continue;
        } else {
            ParamKind::Scalar(ty.clone())
        };
        if let Some(span) = no_specialize
            && !matches!(kind, ParamKind::Scalar(_))
        {
            errors.push(syn::Error::new(
                span,
                "`#[no_specialize]` applies to runtime scalar parameters (`n: i32`): \
                 only their values are specialized on",
            ));
        }
        params.push(Param {
            name,
            mutable,
            kind,
            ty,
            no_specialize: no_specialize.is_some(),
        });
    }
    params
}

fn check_signature(f: &ItemFn, errors: &mut Vec<syn::Error>, what: &str) {
    let sig = &f.sig;
    if let Some(t) = &sig.asyncness {
        errors.push(syn::Error::new(
            t.span,
            format!("a {what} cannot be `async`"),
        ));
    }
    if let Some(t) = &sig.unsafety {
        errors.push(syn::Error::new(
            t.span,
            format!("a {what} cannot be `unsafe`"),
        ));
    }
    if let Some(t) = &sig.constness {
        errors.push(syn::Error::new(
            t.span,
            format!("a {what} cannot be `const`"),
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new(
            abi.span(),
            format!(
                "a {what} cannot have an ABI (`extern`): it is traced into Tessera IR, not \
                 called through a Rust ABI; remove it"
            ),
        ));
    }
    if let Some(v) = &sig.variadic {
        errors.push(syn::Error::new(
            v.span(),
            format!("a {what} cannot be variadic"),
        ));
    }
}

/// Value parameters used where Rust needs a constant (`arange::<n>()`): rustc would say
/// "attempt to use a non-constant value in a constant"; say what to do instead.
fn check_values_as_consts(f: &ItemFn, params: &[Param], errors: &mut Vec<syn::Error>) {
    let names: Vec<Ident> = params
        .iter()
        .filter(|p| !matches!(p.kind, ParamKind::Buffer { .. } | ParamKind::Desc { .. }))
        .map(|p| p.name.clone())
        .collect();
    for use_site in used_in_generic_args_all(&f.block, &names) {
        let Some(p) = params.iter().find(|p| p.name == use_site) else {
            continue;
        };
        let what = match p.kind {
            ParamKind::Comptime(_) => "a `#[comptime]` parameter, a value known only at launch",
            _ => "a runtime kernel parameter",
        };
        errors.push(syn::Error::new(
            use_site.span(),
            format!(
                "`{use_site}` is {what}, so it cannot be used as a constant here (tile sizes \
                 and other generic arguments must be known to the Rust compiler); make it a \
                 const generic of the kernel: `fn {}<const N: usize>(..)`",
                f.sig.ident
            ),
        ));
    }
}

/// Const generics of type `usize` used as tile dimensions get `Const<N>: Pow2`.
fn pow2_bounds(f: &ItemFn) -> Vec<TokenStream> {
    let consts: Vec<Ident> = f
        .sig
        .generics
        .params
        .iter()
        .filter_map(|p| match p {
            GenericParam::Const(c) => match &c.ty {
                Type::Path(tp) if tp.path.is_ident("usize") => Some(c.ident.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let mut used = used_in_generic_args(&f.block, &consts);
    // Helper signatures mention tile shapes too.
    let mut sig_finder_block = syn::Block {
        brace_token: Default::default(),
        stmts: Vec::new(),
    };
    for a in &f.sig.inputs {
        if let FnArg::Typed(t) = a {
            let ty = &t.ty;
            sig_finder_block
                .stmts
                .push(syn::parse_quote!(let _: ::core::marker::PhantomData<#ty>;));
        }
    }
    if let syn::ReturnType::Type(_, ty) = &f.sig.output {
        sig_finder_block
            .stmts
            .push(syn::parse_quote!(let _: ::core::marker::PhantomData<#ty>;));
    }
    for i in used_in_generic_args(&sig_finder_block, &consts) {
        if !used.contains(&i) {
            used.push(i);
        }
    }
    // Spanned at the declaration of the const generic, which notes about an
    // unsatisfied bound point at.
    used.iter()
        .map(|n| {
            let decl = consts.iter().find(|c| *c == n).unwrap_or(n);
            quote_spanned!(decl.span()=> ::tessera::__private::Const<{ #n }>: ::tessera::__private::Pow2)
        })
        .collect()
}

/// Namespaces of tool attributes (`#[rustfmt::skip]`, `#[clippy::cognitive_complexity
/// = ".."]`) accepted on a kernel: they are for tools reading the source as written, and
/// mean nothing for the generated items, so they are dropped.
const TOOL_ATTRIBUTES: &[&str] = &["rustfmt", "clippy", "rust_analyzer", "miri"];

/// The attributes on a kernel function: lint attributes (`allow`, `expect`, ...) apply
/// to every generated item (the kernel's struct, its `Kernel` impl with the traced body
/// in `build`, and `launch`), `cfg`/`cfg_attr` to every generated item, doc comments to
/// the kernel's struct; tool attributes (`#[rustfmt::skip]`) are dropped; any other is
/// an error (`#[inline]`, `#[must_use]`, ... mean nothing for a kernel, which is no
/// function once expanded).
///
/// An `expect` becomes an `allow`: the lint it expects fires in at most some of the
/// generated items, and the items' own `allow`s (unused bindings of the traced body,
/// `clippy::too_many_arguments` of `launch`) would leave it unfulfilled in the others.
/// A `forbid` becomes a `deny`, as it would conflict with those `allow`s.
fn kernel_attrs(
    f: &ItemFn,
    errors: &mut Vec<syn::Error>,
) -> (Vec<syn::Attribute>, Vec<syn::Attribute>) {
    let (mut lints, mut cfgs) = (Vec::new(), Vec::new());
    for a in &f.attrs {
        let p = a.path();
        if p.is_ident("doc") {
        } else if ["allow", "warn", "deny"].iter().any(|l| p.is_ident(l)) {
            lints.push(a.clone());
        } else if p.is_ident("expect") || p.is_ident("forbid") {
            let mut a = a.clone();
            if let syn::Meta::List(l) = &mut a.meta {
                let level = if p.is_ident("expect") {
                    "allow"
                } else {
                    "deny"
                };
                l.path = Ident::new(level, l.path.span()).into();
            }
            lints.push(a);
        } else if p.is_ident("cfg") || p.is_ident("cfg_attr") {
            cfgs.push(a.clone());
        } else if p.is_ident("comptime") || p.is_ident("no_specialize") {
            errors.push(syn::Error::new_spanned(
                a,
                "`#[comptime]` and `#[no_specialize]` mark kernel parameters \
                 (`#[comptime] name: T`), not the kernel",
            ));
        } else if p.segments.len() > 1
            && p.leading_colon.is_none()
            && TOOL_ATTRIBUTES.iter().any(|t| p.segments[0].ident == t)
        {
        } else {
            errors.push(syn::Error::new_spanned(
                a,
                "unsupported attribute on a kernel: a kernel takes doc comments, lint \
                 attributes (`#[allow(..)]`, ...), `#[cfg(..)]` and tool attributes \
                 (`#[rustfmt::skip]`)",
            ));
        }
    }
    (lints, cfgs)
}

pub fn expand_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut f: ItemFn = match syn::parse2(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    let mut errors = Vec::new();
    if !attr.is_empty() {
        errors.push(syn::Error::new(attr.span(), "#[kernel] takes no arguments"));
    }
    check_signature(&f, &mut errors, "kernel");
    if let syn::ReturnType::Type(_, ty) = &f.sig.output
        && !matches!(&**ty, Type::Tuple(t) if t.elems.is_empty())
    {
        errors.push(syn::Error::new_spanned(
            &f.sig.output,
            "a kernel returns nothing; write results into a `&mut Global<T>` buffer",
        ));
    }
    brace_const_generics(&mut f);
    for p in &f.sig.generics.params {
        let default = match p {
            GenericParam::Lifetime(l) => {
                errors.push(syn::Error::new(
                    l.span(),
                    "kernels take no lifetime parameters",
                ));
                None
            }
            GenericParam::Type(t) => t.default.as_ref().map(|d| d.span()),
            GenericParam::Const(c) => c.default.as_ref().map(|d| d.span()),
        };
        if let Some(span) = default {
            errors.push(syn::Error::new(
                span,
                "kernel generic parameters cannot have defaults: give them at launch \
                 (`k::<4>::launch(..)`), or wrap the launch in a function",
            ));
        }
    }
    let (lint_attrs, cfg_attrs) = kernel_attrs(&f, &mut errors);
    let params = parse_params(&mut f, &mut errors);
    check_values_as_consts(&f, &params, &mut errors);
    let mut rw = Rewriter::new();
    let pow2 = pow2_bounds(&f);
    rw.visit_block_mut(&mut f.block);
    errors.extend(rw.errors);
    if !errors.is_empty() {
        return errors_to_tokens(errors);
    }

    let vis = &f.vis;
    let name = &f.sig.ident;
    // The kernel's name as the user reads it (`r#match` is `match`).
    let name_str = name.to_string();
    let name_str = name_str.strip_prefix("r#").unwrap_or(&name_str).to_string();
    let attrs: Vec<_> = f
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .collect();
    let params_ident = proc_macro2::Ident::new("__tessera_params", Span::mixed_site());
    let ct_ident = proc_macro2::Ident::new("__tessera_ct", Span::mixed_site());
    let device = proc_macro2::Ident::new("device", Span::mixed_site());
    let grid = proc_macro2::Ident::new("grid", Span::mixed_site());
    let args = proc_macro2::Ident::new("args", Span::mixed_site());
    let opts = proc_macro2::Ident::new("opts", Span::mixed_site());
    let generics = &f.sig.generics;
    let (impl_generics, _, where_clause) = generics.split_for_impl();
    let ty_generics = type_args(generics);
    let mut where_preds: Vec<TokenStream> = where_clause
        .map(|w| w.predicates.iter().map(|p| quote!(#p)).collect())
        .unwrap_or_default();
    where_preds.extend(pow2);
    let type_params: Vec<&Ident> = generics.type_params().map(|t| &t.ident).collect();
    let body = &f.block;
    // Bounds of `launch` on generic parameter types: a buffer element type `T` must
    // be an `Element` (a kernel may bound it with just `DType`), an aliased parameter
    // type a `RefParam`.
    let mut launch_preds: Vec<TokenStream> = Vec::new();

    // Parameter declarations inside the trace, and launch plumbing.
    let mut declare = Vec::new();
    let mut arg_types = Vec::new();
    let mut arg_names = Vec::new();
    let mut launch_args = Vec::new();
    let mut ct_types = Vec::new();
    let mut ct_names = Vec::new();
    let mut ct_pats = Vec::new();
    let mut desc_shapes: Vec<Type> = Vec::new();
    for p in &params {
        let ty = &p.ty;
        let n = &p.name;
        let ns = n.to_string();
        // `mut name: T` stays mutable in the body.
        let mt = if p.mutable { quote!(mut) } else { quote!() };
        arg_names.push(n.clone());
        match &p.kind {
            ParamKind::Buffer {
                mutable,
                elem,
                symmetric,
            } => {
                // The binding gets the parameter's own type (with the user's spans), so
                // that a store through it reports "behind a `&` reference" pointing at
                // the signature, with a sensible suggestion.
                let (decl, host, ctor) = if *symmetric {
                    (quote!(symmetric), quote!(SymBuffer), "symmetric")
                } else {
                    (quote!(buffer), quote!(Buffer), "buffer")
                };
                let ctor = if *mutable {
                    quote::format_ident!("{ctor}_mut")
                } else {
                    quote::format_ident!("{ctor}")
                };
                if *mutable {
                    declare.push(
                        quote!(let #mt #n: #ty = &mut #params_ident.#decl::<#elem>(#ns, false);),
                    );
                    arg_types.push(quote!(&mut ::tessera::#host<#elem>));
                } else {
                    declare
                        .push(quote!(let #mt #n: #ty = &#params_ident.#decl::<#elem>(#ns, true);));
                    arg_types.push(quote!(&::tessera::#host<#elem>));
                }
                launch_args.push(quote!(::tessera::LaunchArg::#ctor(#n)));
                if mentions(elem, &type_params) {
                    launch_preds.push(quote_spanned!(elem.span()=> #elem: ::tessera::Element));
                }
            }
            ParamKind::Aliased { mutable, inner } => {
                let inner_span = inner.span();
                let rp = quote_spanned!(inner_span=> <#inner as ::tessera::__private::RefParam>);
                if *mutable {
                    declare.push(
                        quote!(let #mt #n: #ty = &mut #rp::declare(#params_ident, #ns, false);),
                    );
                    arg_types.push(quote!(&mut #rp::Host<'_>));
                    launch_args.push(quote!(#rp::arg_mut(#n)));
                } else {
                    declare
                        .push(quote!(let #mt #n: #ty = &#rp::declare(#params_ident, #ns, true);));
                    arg_types.push(quote!(&#rp::Host<'_>));
                    launch_args.push(quote!(#rp::arg(#n)));
                }
                if mentions(inner, &type_params) {
                    let pred = quote_spanned!(inner_span=> #inner: ::tessera::__private::RefParam);
                    where_preds.push(pred.clone());
                    launch_preds.push(pred);
                }
            }
            ParamKind::Desc {
                mutable,
                elem,
                shape,
            } => {
                let ro = !*mutable;
                if mentions(elem, &type_params) {
                    launch_preds.push(quote_spanned!(elem.span()=> #elem: ::tessera::Element));
                }
                let di = desc_shapes.len();
                desc_shapes.push((**shape).clone());
                let dims = quote!(&<Self as ::tessera::Kernel>::desc_blocks()[#di]);
                if *mutable {
                    declare.push(quote!(
                        let #mt #n: #ty = &mut #params_ident.tensor_desc::<#elem, #shape>(#ns, #ro);
                    ));
                    arg_types.push(quote!(&mut ::tessera::TensorDescriptor<'_, #elem>));
                    launch_args.push(quote!(::tessera::LaunchArg::desc_mut(#n, #dims)));
                } else {
                    declare.push(quote!(
                        let #mt #n: #ty = &#params_ident.tensor_desc::<#elem, #shape>(#ns, #ro);
                    ));
                    arg_types.push(quote!(&::tessera::TensorDescriptor<'_, #elem>));
                    launch_args.push(quote!(::tessera::LaunchArg::desc(#n, #dims)));
                }
            }
            ParamKind::Scalar(ty) => {
                let ty_span = ty.span();
                let ctor = if p.no_specialize {
                    quote_spanned!(ty_span=> scalar_unspecialized)
                } else {
                    quote_spanned!(ty_span=> scalar)
                };
                declare
                    .push(quote_spanned!(ty_span=> let #mt #n = #params_ident.#ctor::<#ty>(#ns);));
                arg_types.push(quote!(#ty));
                launch_args.push(quote!(::tessera::LaunchArg::scalar::<#ty>(#n)));
            }
            ParamKind::Comptime(ty) => {
                arg_types.push(quote!(#ty));
                ct_types.push(ty.clone());
                ct_names.push(n.clone());
                ct_pats.push(if p.mutable {
                    quote!(mut #n)
                } else {
                    quote!(#n)
                });
            }
        }
    }
    let fn_span = f.sig.fn_token.span;
    let span_expr = quote_spanned!(fn_span=>
        ::tessera::__private::Span::new(::core::file!(), ::core::line!(), ::core::column!())
    );
    let doc = format!(
        "Tessera kernel `{name_str}`: launch with [`{name_str}::launch`]; \
         the IR is built by its [`tessera::Kernel`] implementation."
    );
    let launch_doc = format!(
        "Launches `{name_str}` on `device` over `grid` program instances with `args` in \
         the order of the kernel's parameters. The IR is built once per comptime \
         arguments and cached."
    );
    let launch_with_doc = format!(
        "Launches `{name_str}` like [`{name_str}::launch`], with `opts` (warps, pipeline \
         stages, stream: [`tessera::LaunchOptions`])."
    );

    let launch_bound = quote_spanned!(name.span()=>
        Self: ::tessera::Kernel<Comptime = (#(#ct_types,)*)>,
    );
    let launch_bound = quote!(#launch_bound #(#launch_preds,)*);

    quote! {
        #(#attrs)*
        #[doc = #doc]
        #(#lint_attrs)*
        #[allow(non_camel_case_types)]
        // A braced struct, so that a parameter or local named like the kernel is
        // an ordinary binding (a tuple or unit struct's name cannot be shadowed:
        // E0530).
        #(#cfg_attrs)*
        #vis struct #name #impl_generics #where_clause {
            _types: ::core::marker::PhantomData<fn() -> (#(#type_params,)*)>,
        }

        #(#cfg_attrs)*
        #(#lint_attrs)*
        impl #impl_generics ::tessera::Kernel for #name #ty_generics where #(#where_preds,)* {
            const NAME: &'static str = #name_str;
            type Comptime = (#(#ct_types,)*);

            fn desc_blocks() -> ::std::vec::Vec<::std::vec::Vec<u32>> {
                ::std::vec![#(<#desc_shapes as ::tessera::__private::Shape>::dims()),*]
            }

            #[allow(unused_variables, unused_mut, unused_braces, unused_assignments, clippy::all)]
            fn build(
                #ct_ident: &Self::Comptime,
            ) -> ::core::result::Result<::tessera::__private::Function, ::tessera::__private::BuildError> {
                let (#(#ct_pats,)*) = ::core::clone::Clone::clone(#ct_ident);
                ::tessera::__private::trace(#name_str, #span_expr, |#params_ident| {
                    #(#declare)*
                    #body
                })
            }
        }

        // `launch` requires `Self: Kernel` (and so the tile-dimension bounds) on the
        // method rather than on the impl: `k::<48>::launch` then reports the unsatisfied
        // `Const<48>: Pow2` with its own message, not "no function `launch`".
        // `device`, `grid`, `args` and `__tessera_ct` are hygienic (mixed-site): kernel
        // parameters of those names are other bindings.
        #(#cfg_attrs)*
        #(#lint_attrs)*
        impl #impl_generics #name #ty_generics #where_clause {
            #[doc = #launch_doc]
            #[allow(clippy::too_many_arguments, clippy::type_complexity)]
            pub fn launch(
                #device: &::tessera::Device,
                #grid: impl ::core::convert::Into<::tessera::Grid>,
                #args: (#(#arg_types,)*),
            ) -> ::core::result::Result<(), ::tessera::Error>
            where
                #launch_bound
            {
                Self::launch_with(#device, #grid, &::tessera::LaunchOptions::default(), #args)
            }

            #[doc = #launch_with_doc]
            #[allow(clippy::too_many_arguments, clippy::type_complexity)]
            pub fn launch_with(
                #device: &::tessera::Device,
                #grid: impl ::core::convert::Into<::tessera::Grid>,
                #opts: &::tessera::LaunchOptions,
                #args: (#(#arg_types,)*),
            ) -> ::core::result::Result<(), ::tessera::Error>
            where
                #launch_bound
            {
                let (#(#arg_names,)*) = #args;
                let #ct_ident: <Self as ::tessera::Kernel>::Comptime = (#(#ct_names,)*);
                ::tessera::launch_with::<Self>(
                    #device,
                    #grid.into(),
                    #opts,
                    &#ct_ident,
                    &mut [#(#launch_args),*],
                )
            }
        }
    }
}

pub fn expand_helper(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut f: ItemFn = match syn::parse2(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error(),
    };
    let mut errors = Vec::new();
    if !attr.is_empty() {
        errors.push(syn::Error::new(attr.span(), "#[helper] takes no arguments"));
    }
    check_signature(&f, &mut errors, "helper");
    check_size1_shapes(&f, &mut errors);
    brace_const_generics(&mut f);
    let pow2 = pow2_bounds(&f);
    let mut rw = Rewriter::new();
    rw.visit_block_mut(&mut f.block);
    errors.extend(rw.errors);
    if !errors.is_empty() {
        return errors_to_tokens(errors);
    }
    if !pow2.is_empty() {
        let wc = f.sig.generics.make_where_clause();
        for b in pow2 {
            wc.predicates.push(syn::parse_quote!(#b));
        }
    }
    // Counts the nesting of helper calls while tracing: a recursion that never reaches
    // its base case is a build error naming the helper, not a stack overflow.
    let name = f.sig.ident.to_string();
    let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
    let guard = proc_macro2::Ident::new("__tessera_helper_call", Span::mixed_site());
    let enter: syn::Stmt = syn::parse_quote_spanned! {f.sig.ident.span()=>
        let #guard = ::tessera::ir::dsl::enter_helper(
            #name, ::core::file!(), ::core::line!(), ::core::column!());
    };
    f.block.stmts.insert(0, enter);
    quote!(#f)
}
