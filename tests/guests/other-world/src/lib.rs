//! A component of another world: it exports `run: func() -> u32` and nothing Sluice expects.
#![allow(missing_docs, unsafe_code)]

wit_bindgen::generate!({
    inline: "
        package test:other;
        world other {
            export run: func() -> u32;
        }
    ",
});

struct Other;

impl Guest for Other {
    fn run() -> u32 {
        42
    }
}

export!(Other);
