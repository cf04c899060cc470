//! The page's frame: every page's head and layout (stylesheet, script, who is logged in), the
//! small pages that only say something (login, welcome, a message), and the links between pages.
//! maud escapes every interpolated value; the layout is the only static HTML.

use maud::{DOCTYPE, Markup, html};

use super::Viewer;
use crate::store::keys::SubscriptionKeys;

/// `text` as one URL path segment or query value.
pub(super) fn segment(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Every page's head: its title and the stylesheet.
fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) }
            link rel="stylesheet" href="/ui/style.css";
        }
    }
}

/// Every page but the loader: its head, the header with who is looking, and `body`.
pub(super) fn layout(title: &str, viewer: Option<&Viewer>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(&format!("{title} · Sluice")))
            // A logged-in viewer's page: its script fetches links and forms with the key.
            body data-keyed[viewer.is_some_and(|v| v.logged_in)] data-rendered=(rendered_ms()) {
                header {
                    a.brand href="/ui/" { "Sluice" }
                    a href="/ui/" { "Overview" }
                    a href="/ui/audit" { "Audit" }
                    @if let Some(viewer) = viewer {
                        @if viewer.role == super::Role::Reader {
                            span.muted.role title="Logged in with the read-only token (admin_read_token): every action is refused" { "read-only token" }
                        } @else if !viewer.can_act {
                            span.muted title="Actions need an admin token (admin_token_file or admin_token_env, then log in) or admin_open_on_loopback = true; `sluice dev` allows them on loopback" { "read-only ⓘ" }
                        }
                        @if viewer.logged_in {
                            form method="post" action="/ui/logout" {
                                input type="hidden" name="csrf" value=(viewer.csrf);
                                button type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main { (body) }
                script src="/ui/script.js" {}
            }
        }
    }
}

/// A page with no data and only the script: what the script's fetch with the session's key
/// replaces (the page a navigation gets), or, with `key`, where the key is handed over at
/// login.
fn bare(key: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head("Sluice"))
            body data-loader data-key=[key] {
                main {
                    p.muted { "Loading…" }
                    noscript {
                        p { "The admin page needs JavaScript: it keeps its session key where only this page can read it." }
                    }
                }
                script src="/ui/script.js" {}
            }
        }
    }
}

/// What a navigation of a logged-in viewer gets (see [`bare`]).
pub(super) fn loader() -> Markup {
    bare(None)
}

/// The answer to a good login: the session's key, for the script to keep.
pub(super) fn welcome(key: &str) -> Markup {
    bare(Some(key))
}

/// The login form, with an error after a wrong token.
pub(super) fn login(error: Option<&str>) -> Markup {
    layout(
        "Log in",
        None,
        html! {
            div.card.login data-login {
                h1 { "Sluice admin" }
                p.muted { "Paste the admin token (the contents of admin_token_file)." }
                @if let Some(error) = error { p.bad { (error) } }
                form method="post" action="/ui/login" {
                    p { input type="password" name="token" autofocus placeholder="admin token" style="width:100%"; }
                    button.primary type="submit" { "Log in" }
                }
            }
        },
    )
}

/// A page that only says something (an error, a refusal).
pub(super) fn message(text: &str) -> Markup {
    layout(
        "Sluice",
        None,
        html! { div.card { p { (text) } p { a href="/ui/" { "Back to the overview" } } } },
    )
}

/// The result of the viewer's last action, shown once at the top of the next page.
pub(super) fn flash(done: Option<&str>) -> Markup {
    html! { @if let Some(done) = done { div.flash { (done) } } }
}

/// The link to `page` of a subscription (one partition of a partitioned one).
pub(super) fn sub_link(keys: &SubscriptionKeys, page: &str) -> String {
    format!(
        "/ui/s/{}/{}/{page}",
        segment(&keys.stream),
        segment(&keys.group)
    )
}

/// A link to the page of the entry whose origin id is `id`.
pub(super) fn entry_link(keys: &SubscriptionKeys, id: &str) -> String {
    format!("{}?id={}", sub_link(keys, "entry"), segment(id))
}

/// A form that opens an entry's page by its id.
pub(super) fn find_entry(keys: &SubscriptionKeys) -> Markup {
    html! {
        form.inline method="get" action=(sub_link(keys, "entry")) {
            input type="text" name="id" placeholder="entry id" size="18" pattern="[0-9]+-[0-9]+" required;
            " " button type="submit" { "Show entry" }
        }
    }
}

/// When a page was rendered (ms since the Unix epoch, this host's clock): how a browser (and
/// its test) tells a refreshed page from the one before.
pub(super) fn rendered_ms() -> u128 {
    crate::support::clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}
