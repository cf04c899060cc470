//! `dedupe`: where a subscription's dedupe key is, and its window and bounds. Checked key by
//! key, so a misspelt one is named.

use sluice_descriptor::{Dedupe, DescriptorError};

use super::ConfigError;
use super::check::Validator;
use super::raw::RawOrderedBy;

/// The keys a `dedupe` table takes.
const KEYS: [&str; 5] = ["field", "payload", "window", "max_key_bytes", "max_keys"];

/// `dedupe`: `"none"` takes the descriptor's dedupe away (`Some(None)`), a table names where
/// the key is (exactly one of `field` and `payload`) and, optionally, the window and bounds.
pub(super) fn dedupe(
    v: &Validator<'_>,
    key: &dyn Fn(&str) -> String,
    raw: Option<&RawOrderedBy>,
) -> Result<Option<Option<Dedupe>>, ConfigError> {
    let set = match raw {
        None => return Ok(None),
        Some(RawOrderedBy::Keyword(word)) if word == "none" => return Ok(Some(None)),
        Some(RawOrderedBy::Keyword(word)) => {
            return Err(v.invalid(
                &key("dedupe"),
                word,
                "expected \"none\" or a table { field = \"...\", window = \"24h\" } or { payload = \"/pointer\", window = \"24h\" }",
            ));
        }
        Some(RawOrderedBy::Key(set)) => set,
    };
    let text = |name: &str| -> Result<Option<String>, ConfigError> {
        match set.get(name) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(v.invalid(
                &key(&format!("dedupe.{name}")),
                &other.to_string(),
                "expected a string",
            )),
        }
    };
    let count = |name: &str| -> Result<Option<u64>, ConfigError> {
        match set.get(name) {
            None => Ok(None),
            Some(toml::Value::Integer(n)) if *n > 0 => Ok(Some(*n as u64)),
            Some(other) => Err(v.invalid(
                &key(&format!("dedupe.{name}")),
                &other.to_string(),
                "expected a positive whole number",
            )),
        }
    };
    if let Some(unknown) = set.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(v.invalid(
            &key(&format!("dedupe.{unknown}")),
            unknown,
            "unknown key: dedupe takes field or payload, window, max_key_bytes and max_keys",
        ));
    }
    let mut dedupe = match (text("field")?, text("payload")?) {
        (Some(field), None) => Dedupe::field(field),
        (None, Some(pointer)) => Dedupe::payload(pointer),
        _ => {
            return Err(v.invalid(
                &key("dedupe"),
                "{ .. }",
                "name exactly one of `field` (a stream field) and `payload` (a JSON pointer into the payload)",
            ));
        }
    };
    if let Some(window) = text("window")? {
        dedupe.window = v.duration(&key("dedupe.window"), &window)?;
    }
    if let Some(n) = count("max_key_bytes")? {
        dedupe.max_key_bytes = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = count("max_keys")? {
        dedupe.max_keys = n;
    }
    match dedupe.check("") {
        Ok(()) => Ok(Some(Some(dedupe))),
        Err(DescriptorError::Dedupe { problem, .. }) => {
            Err(v.invalid(&key("dedupe"), &dedupe.key.describe(), &problem))
        }
        Err(other) => Err(v.invalid(&key("dedupe"), &dedupe.key.describe(), &other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::super::file::parse_file;

    fn load(dedupe: &str) -> Result<Option<Option<sluice_descriptor::Dedupe>>, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("h.wasm"), b"\0asm").unwrap();
        let text = format!("[[subscription]]\ncomponent = \"h.wasm\"\ndedupe = {dedupe}\n");
        parse_file(&dir.path().join("sluice.toml"), &text)
            .map(|file| file.subscriptions[0].overrides.dedupe.clone())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_dedupe_table_is_read_and_its_mistakes_are_named() {
        let dedupe = load("{ field = \"id\", window = \"2h\", max_keys = 10 }").unwrap();
        let dedupe = dedupe.unwrap().unwrap();
        assert_eq!(dedupe.window, std::time::Duration::from_secs(7200));
        assert_eq!(dedupe.max_keys, 10);
        let err = |text: &str| load(text).unwrap_err();
        assert!(err("{ field = \"id\", windw = \"2h\" }").contains("dedupe.windw"));
        assert!(err("{ window = \"2h\" }").contains("exactly one"));
        assert!(err("{ field = \"id\", window = \"10ms\" }").contains("window"));
        assert!(err("{ payload = \"id\" }").contains("must start with `/`"));
        assert!(err("{ field = \"id\", max_keys = 0 }").contains("positive"));
        assert!(err("\"nope\"").contains("expected \"none\""));
        assert_eq!(load("\"none\"").unwrap(), Some(None));
    }
}
