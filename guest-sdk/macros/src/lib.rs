//! The `#[subscriber]` attribute of the Sluice guest SDK (`sluice-guest`). Use it through
//! `sluice_guest::subscriber`; it is sugar over the SDK's `Handle` trait and `export!` macro.

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::{format_ident, quote};
use syn::{Expr, FnArg, ItemFn, PatType, Type, parse_macro_input, spanned::Spanned};

/// Export a function as this component's Redis Streams handler.
///
/// The attribute's argument is the subscription descriptor, a `RedisStream` expression. The
/// function takes the decoded payload by reference first, then optionally the per-instance state
/// as `State<S>` and the raw delivery as `&Delivery`, in any order; it may be `async`, and it
/// returns `HandlerOutcome` or `Result<(), HandlerOutcome>`.
///
/// ```ignore
/// #[subscriber(RedisStream::new("bank-payments").group("billing"))]
/// async fn charge_bank(payment: &Payment, State(gateway): State<PaymentGateway>) -> HandlerOutcome {
///     HandlerOutcome::ack()
/// }
/// ```
#[proc_macro_attribute]
pub fn subscriber(attr: TokenStream, item: TokenStream) -> TokenStream {
    if attr.is_empty() {
        return syn::Error::new(
            Span::call_site(),
            "#[subscriber] needs a descriptor: #[subscriber(RedisStream::new(\"stream\").group(\"group\"))]",
        )
        .to_compile_error()
        .into();
    }
    let descriptor = parse_macro_input!(attr as Expr);
    let function = parse_macro_input!(item as ItemFn);
    match expand(&descriptor, &function) {
        Ok(tokens) => tokens.into(),
        Err(err) => err.to_compile_error().into(),
    }
}

/// The handler a `#[subscriber]` function defines, as a value, for a test:
/// `TestDelivery::json("{}").run(&handler!(handle))`, or `handler!(super::handle)` from a test
/// module (see `sluice_guest::testing`).
#[proc_macro]
pub fn handler(item: TokenStream) -> TokenStream {
    let mut path = parse_macro_input!(item as syn::Path);
    // `handle` or `super::handle`: the type sits beside the function.
    if let Some(last) = path.segments.last_mut() {
        last.ident = format_ident!("__SluiceSubscriber_{}", last.ident);
    }
    quote!(#path).into()
}

/// What an extra handler argument asks for.
enum Extra {
    State(Box<Type>),
    Delivery,
}

fn expand(descriptor: &Expr, function: &ItemFn) -> syn::Result<proc_macro2::TokenStream> {
    let sig = &function.sig;
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new_spanned(
            &sig.generics,
            "a #[subscriber] function cannot be generic: the payload and state types must be concrete",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        return Err(syn::Error::new_spanned(
            variadic,
            "a #[subscriber] function cannot be variadic",
        ));
    }
    let mut args = sig.inputs.iter();
    let input_type = match args.next() {
        None => {
            return Err(syn::Error::new_spanned(
                sig,
                "a #[subscriber] function takes the decoded payload first, e.g. `payment: &Payment`",
            ));
        }
        Some(FnArg::Receiver(receiver)) => {
            return Err(syn::Error::new_spanned(
                receiver,
                "a #[subscriber] function cannot take `self`; implement `Handle` for a type instead",
            ));
        }
        Some(FnArg::Typed(PatType { ty, .. })) => match &**ty {
            Type::Reference(reference) if reference.mutability.is_none() => {
                (*reference.elem).clone()
            }
            other => {
                return Err(syn::Error::new_spanned(
                    other,
                    "the first argument of a #[subscriber] function is the payload by shared reference, e.g. `payment: &Payment`",
                ));
            }
        },
    };

    let mut extras = Vec::new();
    for arg in args {
        let FnArg::Typed(PatType { ty, .. }) = arg else {
            return Err(syn::Error::new_spanned(
                arg,
                "unexpected receiver in a #[subscriber] function",
            ));
        };
        extras.push((classify(ty)?, arg.span()));
    }
    let mut state_type: Option<Type> = None;
    let mut seen_delivery = false;
    for (extra, span) in &extras {
        match extra {
            Extra::State(ty) if state_type.is_none() => state_type = Some((**ty).clone()),
            Extra::State(_) => {
                return Err(syn::Error::new(
                    *span,
                    "only one `State<_>` argument is allowed",
                ));
            }
            Extra::Delivery if !seen_delivery => seen_delivery = true,
            Extra::Delivery => {
                return Err(syn::Error::new(
                    *span,
                    "only one `&Delivery` argument is allowed",
                ));
            }
        }
    }
    let state = state_type.unwrap_or_else(|| syn::parse_quote!(()));
    let call_args = extras.iter().map(|(extra, _)| match extra {
        Extra::State(_) => {
            quote!(::sluice_guest::State(::core::clone::Clone::clone(
                __sluice_ctx.state()
            )))
        }
        Extra::Delivery => quote!(__sluice_ctx.delivery()),
    });

    let name = &sig.ident;
    let handler_type = format_ident!("__SluiceSubscriber_{}", name);
    let descriptor_fn = format_ident!("__sluice_descriptor_{}", name);
    let awaited = if sig.asyncness.is_some() {
        quote!(.await)
    } else {
        quote!()
    };
    // Use the return type's span so a wrong return type is reported on the user's signature.
    let ret_span = match &sig.output {
        syn::ReturnType::Default => sig.ident.span(),
        syn::ReturnType::Type(_, ty) => ty.span(),
    };
    let into_result =
        quote::quote_spanned!(ret_span=> ::sluice_guest::rt::into_result(__sluice_ret));

    Ok(quote! {
        #function

        #[doc(hidden)]
        #[allow(non_camel_case_types)]
        struct #handler_type;

        impl ::sluice_guest::Handle<#input_type, (), (), (), #state> for #handler_type {
            async fn handle(
                &self,
                __sluice_input: &#input_type,
                _: &(),
                __sluice_ctx: &mut ::sluice_guest::Context<'_, (), #state>,
            ) -> ::core::result::Result<(), ::sluice_guest::HandlerOutcome> {
                let __sluice_ret = #name(__sluice_input #(, #call_args)*) #awaited;
                #into_result
            }
        }

        #[doc(hidden)]
        fn #descriptor_fn() -> ::sluice_guest::RedisStream {
            #[allow(unused_imports)]
            use ::sluice_guest::prelude::*;
            #descriptor
        }

        ::sluice_guest::export!(#handler_type, #descriptor_fn);
    })
}

fn classify(ty: &Type) -> syn::Result<Extra> {
    match ty {
        Type::Path(path) => {
            if let Some(last) = path.path.segments.last()
                && last.ident == "State"
                && let syn::PathArguments::AngleBracketed(args) = &last.arguments
                && let Some(syn::GenericArgument::Type(inner)) = args.args.first()
            {
                return Ok(Extra::State(Box::new(inner.clone())));
            }
        }
        Type::Reference(reference) => {
            if let Type::Path(path) = &*reference.elem
                && path
                    .path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "Delivery")
            {
                return Ok(Extra::Delivery);
            }
        }
        _ => {}
    }
    Err(syn::Error::new_spanned(
        ty,
        "unsupported #[subscriber] argument: after the payload, a handler may take `State<S>` and `&Delivery`",
    ))
}
