//! A URL without its password ([`redact`]): every log line and error that names a Redis says
//! where it is, never how to log in.

/// The URL (or each of a cluster's seed URLs) with any password replaced, for logs and errors.
pub fn redact(url: &str) -> String {
    let one = |url: &str| match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    };
    let urls: Vec<String> = url.split_whitespace().map(one).collect();
    if urls.len() > 1 {
        urls.join(" ")
    } else {
        one(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords() {
        assert_eq!(
            redact("redis://:secret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }
}
