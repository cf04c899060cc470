//! A Lua script's options as one MessagePack map of named fields, sent as one `ARGV`: a script
//! with many options reads `o.ttl_ms` instead of `ARGV[3]`, and adding one is a new name, not a
//! renumbering of every argument after it (`sweep.lua` once took 23 positional arguments).
//! Scripts unpack it with Redis's `cmsgpack.unpack`; numbers stay below 2^53 (a Lua number is
//! a double), names and values are strings, and flags are booleans.

use rmpv::Value;

/// Named options, in the order they are added.
#[derive(Debug, Default)]
pub(crate) struct ScriptOptions(Vec<(Value, Value)>);

impl ScriptOptions {
    /// Adds `name` = `value`.
    pub(crate) fn with(mut self, name: &'static str, value: impl Into<Value>) -> Self {
        self.0.push((Value::from(name), value.into()));
        self
    }

    /// Adds `name` = a map of `(key, value)` strings (a script's field names or seal uses).
    pub(crate) fn names(self, name: &'static str, pairs: &[(&'static str, &str)]) -> Self {
        let map = pairs
            .iter()
            .map(|(k, v)| (Value::from(*k), Value::from(*v)))
            .collect();
        self.with(name, Value::Map(map))
    }

    /// The MessagePack bytes of the map.
    pub(crate) fn encode(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 * self.0.len());
        // Writing to a Vec cannot fail.
        let _ = rmpv::encode::write_value(&mut out, &Value::Map(self.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_a_map_of_names() {
        let bytes = ScriptOptions::default()
            .with("batch", 128u64)
            .with("past", true)
            .names("fields", &[("mark", "sluice-mark")])
            .encode();
        let value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let Value::Map(items) = value else {
            panic!("not a map: {value:?}")
        };
        assert_eq!(items[0], (Value::from("batch"), Value::from(128u64)));
        assert_eq!(items[1], (Value::from("past"), Value::from(true)));
        assert_eq!(
            items[2].1,
            Value::Map(vec![(Value::from("mark"), Value::from("sluice-mark"))])
        );
    }
}
