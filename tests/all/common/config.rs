//! Test configurations, built instead of written as escaped TOML: a [`Sub`] is one
//! `[[subscription]]`, a [`TestConfig`] the whole file. Their `Display` is the TOML the host
//! reads (through [`super::write_config`], which fills in the component paths and the admin
//! token).

use std::fmt;

/// A TOML value as it is written after `key = `.
pub trait Toml {
    /// The value in TOML syntax.
    fn toml(&self) -> String;
}

impl Toml for &str {
    fn toml(&self) -> String {
        // Rust's escaping of a string is TOML's basic-string escaping for everything a test
        // writes (quotes, backslashes, control characters).
        format!("{self:?}")
    }
}

impl Toml for String {
    fn toml(&self) -> String {
        self.as_str().toml()
    }
}

impl Toml for bool {
    fn toml(&self) -> String {
        self.to_string()
    }
}

macro_rules! toml_integers {
    ($($t:ty),*) => { $( impl Toml for $t { fn toml(&self) -> String { self.to_string() } } )* };
}
toml_integers!(i32, i64, u32, u64, usize);

/// A TOML value written verbatim: an inline table or an array.
pub struct Raw<'a>(pub &'a str);

impl Toml for Raw<'_> {
    fn toml(&self) -> String {
        self.0.to_owned()
    }
}

/// Keys in the order they were first set; setting a key again replaces its value.
#[derive(Debug, Clone, Default)]
struct Keys(Vec<(String, String)>);

impl Keys {
    fn set(&mut self, key: &str, value: String) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key.to_owned(), value)),
        }
    }

    fn unset(&mut self, key: &str) {
        self.0.retain(|(k, _)| k != key);
    }
}

impl fmt::Display for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (key, value) in &self.0 {
            writeln!(f, "{key} = {value}")?;
        }
        Ok(())
    }
}

/// One `[[subscription]]`.
#[derive(Debug, Clone)]
pub struct Sub {
    stream: String,
    keys: Keys,
    values: Keys,
}

impl Sub {
    /// `component` (a placeholder like `{fixture}`, see [`super::write_config`]) on `stream`,
    /// group `g`, consumer `c1`, reads blocking 100 ms.
    pub fn new(component: &str, stream: &str) -> Self {
        let mut keys = Keys::default();
        keys.set("component", component.toml());
        keys.set("stream", stream.toml());
        keys.set("group", "g".toml());
        keys.set("consumer", "c1".toml());
        keys.set("block", "100ms".toml());
        Self {
            stream: stream.to_owned(),
            keys,
            values: Keys::default(),
        }
    }

    /// `component` with its own descriptor: no stream, group, consumer or block set here.
    pub fn as_built(component: &str) -> Self {
        let mut keys = Keys::default();
        keys.set("component", component.toml());
        Self {
            stream: String::new(),
            keys,
            values: Keys::default(),
        }
    }

    /// The fixture guest on `stream` (see [`Sub::new`] for the rest).
    pub fn fixture(stream: &str) -> Self {
        Self::new("{fixture}", stream)
    }

    /// The stream it reads (empty for [`Sub::as_built`]).
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Set `key` (replacing the default or an earlier value).
    pub fn set(mut self, key: &str, value: impl Toml) -> Self {
        self.keys.set(key, value.toml());
        self
    }

    /// Leave `key` out (the host's or the component's default applies).
    pub fn unset(mut self, key: &str) -> Self {
        self.keys.unset(key);
        self
    }

    /// Park retries in the durable set `key`.
    pub fn delayed(self, key: &str) -> Self {
        let table = format!("{{ key = {} }}", key.toml());
        self.set("delayed_retry", Raw(&table))
    }

    /// A `[subscription.config]` value the guest can read.
    pub fn value(mut self, name: &str, value: &str) -> Self {
        self.values.set(name, value.toml());
        self
    }
}

impl fmt::Display for Sub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[[subscription]]\n{}", self.keys)?;
        if !self.values.0.is_empty() {
            write!(f, "[subscription.config]\n{}", self.values)?;
        }
        Ok(())
    }
}

/// A whole config file: top-level keys, then the subscriptions.
#[derive(Debug, Clone, Default)]
pub struct TestConfig {
    keys: Keys,
    no_token: bool,
    subs: Vec<Sub>,
}

impl TestConfig {
    /// A file with `sub` as its only subscription.
    pub fn of(sub: Sub) -> Self {
        Self {
            subs: vec![sub],
            ..Self::default()
        }
    }

    /// Set a top-level key.
    pub fn set(mut self, key: &str, value: impl Toml) -> Self {
        self.keys.set(key, value.toml());
        self
    }

    /// Add a subscription.
    pub fn and(mut self, sub: Sub) -> Self {
        self.subs.push(sub);
        self
    }

    /// Give the host no admin token (by default every test host gets [`super::TEST_TOKEN`]).
    pub fn no_admin_token(mut self) -> Self {
        self.no_token = true;
        self
    }
}

impl From<Sub> for TestConfig {
    fn from(sub: Sub) -> Self {
        Self::of(sub)
    }
}

impl fmt::Display for TestConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.no_token {
            writeln!(f, "# no admin token")?;
        }
        write!(f, "{}", self.keys)?;
        for sub in &self.subs {
            write!(f, "{sub}")?;
        }
        Ok(())
    }
}
