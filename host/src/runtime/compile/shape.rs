//! The structural check run before any compile ([`check_shape`]): function size, locals, and
//! how deep loops nest, read with wasmparser in one linear pass, so the known compile-time
//! blow-ups are refused in milliseconds with a message naming the function.

use wasmparser::{BinaryReaderError, FunctionBody, Operator, Parser, Payload};

/// The largest function body a component may hold, in bytes.
pub const MAX_FUNCTION_BYTES: usize = 4 << 20;
/// The most locals one function may declare.
pub const MAX_LOCALS: u64 = 50_000;
/// How deep loops may nest in one function. Compile time grows with loop depth times the
/// locals live across it; real code nests a few loops (a CPython or SpiderMonkey component
/// stays under 20).
pub const MAX_LOOP_DEPTH: u32 = 64;
/// The most a function's loop depth times its locals may be (the bomb above: 300 × 300).
/// Measured on real components: CPython 6 × 271, SpiderMonkey 6 × 118, a Rust handler 3 × 35.
pub const MAX_LOOP_LOCALS: u64 = 16_384;

/// The shape of a component's code, measured by [`check_shape`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Core functions.
    pub functions: u64,
    /// The largest body, in bytes.
    pub largest_body: usize,
    /// The most locals of one function.
    pub most_locals: u64,
    /// The deepest loop nesting of one function.
    pub deepest_loops: u32,
}

/// Why a component's shape was refused.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    /// The bytes do not parse.
    #[error("it is not a valid WebAssembly component: {0}")]
    Parse(#[from] BinaryReaderError),
    /// A bound was passed.
    #[error("function {function} of a core module {what}")]
    Bound {
        /// The function's index in its code section.
        function: u64,
        /// Which bound, and by how much.
        what: String,
    },
}

/// Measure `bytes` and refuse them when a function passes a bound, without compiling.
pub fn check_shape(bytes: &[u8]) -> Result<Shape, ShapeError> {
    let mut shape = Shape::default();
    let mut index = 0u64;
    let mut types = CoreTypes::default();
    for payload in Parser::new(0).parse_all(bytes) {
        match payload? {
            Payload::Version {
                encoding: wasmparser::Encoding::Module,
                ..
            } => types = CoreTypes::default(),
            Payload::TypeSection(section) => types.read_types(section)?,
            Payload::FunctionSection(section) => types.read_functions(section)?,
            Payload::CodeSectionStart { .. } => index = 0,
            Payload::CodeSectionEntry(body) => {
                let function = index;
                index += 1;
                check_function(function, types.params(function), &body, &mut shape)?;
            }
            _ => {}
        }
    }
    Ok(shape)
}

/// Of the core module being read: each type's parameter count (0 for types that are not
/// functions), and each defined function's type. Parameters are locals too.
#[derive(Debug, Default)]
struct CoreTypes {
    type_params: Vec<u64>,
    function_types: Vec<u32>,
}

impl CoreTypes {
    fn read_types(
        &mut self,
        section: wasmparser::TypeSectionReader<'_>,
    ) -> Result<(), BinaryReaderError> {
        for group in section {
            for ty in group?.into_types() {
                self.type_params.push(match &ty.composite_type.inner {
                    wasmparser::CompositeInnerType::Func(f) => f.params().len() as u64,
                    _ => 0,
                });
            }
        }
        Ok(())
    }

    fn read_functions(
        &mut self,
        section: wasmparser::FunctionSectionReader<'_>,
    ) -> Result<(), BinaryReaderError> {
        for ty in section {
            self.function_types.push(ty?);
        }
        Ok(())
    }

    /// The parameter count of the `function`th body of the code section (0 if unknown).
    fn params(&self, function: u64) -> u64 {
        usize::try_from(function)
            .ok()
            .and_then(|i| self.function_types.get(i))
            .and_then(|&ty| self.type_params.get(ty as usize))
            .copied()
            .unwrap_or(0)
    }
}

/// Measure one function body into `shape`, refusing it past a bound.
fn check_function(
    function: u64,
    params: u64,
    body: &FunctionBody<'_>,
    shape: &mut Shape,
) -> Result<(), ShapeError> {
    let bound = |what: String| ShapeError::Bound { function, what };
    shape.functions += 1;
    let size = body.range().len();
    shape.largest_body = shape.largest_body.max(size);
    if size > MAX_FUNCTION_BYTES {
        return Err(bound(format!(
            "is {size} bytes long (at most {MAX_FUNCTION_BYTES})"
        )));
    }
    let mut locals = params;
    for group in body.get_locals_reader()? {
        locals = locals.saturating_add(u64::from(group?.0));
    }
    shape.most_locals = shape.most_locals.max(locals);
    if locals > MAX_LOCALS {
        return Err(bound(format!(
            "has {locals} locals, parameters included (at most {MAX_LOCALS})"
        )));
    }
    let deepest = loop_depth(body).map_err(|e| match e {
        Deep::Parse(e) => ShapeError::Parse(e),
        Deep::TooDeep => bound(format!("nests loops more than {MAX_LOOP_DEPTH} deep")),
    })?;
    shape.deepest_loops = shape.deepest_loops.max(deepest);
    if u64::from(deepest) * locals > MAX_LOOP_LOCALS {
        return Err(bound(format!(
            "nests loops {deepest} deep over {locals} locals (their product at most {MAX_LOOP_LOCALS}: compile time grows with its square)"
        )));
    }
    Ok(())
}

/// Why [`loop_depth`] stopped reading.
enum Deep {
    Parse(BinaryReaderError),
    TooDeep,
}

impl From<BinaryReaderError> for Deep {
    fn from(e: BinaryReaderError) -> Self {
        Self::Parse(e)
    }
}

/// How deep loops nest in `body`, given up past [`MAX_LOOP_DEPTH`].
fn loop_depth(body: &FunctionBody<'_>) -> Result<u32, Deep> {
    let mut deepest = 0u32;
    // Each open block remembers whether it is a loop.
    let mut open: Vec<bool> = Vec::new();
    let mut loops = 0u32;
    let mut ops = body.get_operators_reader()?;
    while !ops.eof() {
        match ops.read()? {
            Operator::Loop { .. } => {
                open.push(true);
                loops += 1;
                deepest = deepest.max(loops);
                if loops > MAX_LOOP_DEPTH {
                    return Err(Deep::TooDeep);
                }
            }
            Operator::Block { .. } | Operator::If { .. } | Operator::TryTable { .. } => {
                open.push(false);
            }
            Operator::End if open.pop() == Some(true) => loops -= 1,
            _ => {}
        }
    }
    Ok(deepest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A core module in a component: one function with `params` i32 parameters and `locals`
    /// locals, its body `loops` nested loops.
    fn component(params: usize, locals: usize, loops: usize) -> Vec<u8> {
        let body = format!("{}{}", "(loop ".repeat(loops), ")".repeat(loops));
        let text = format!(
            "(component (core module (func (param {}) (local {}) {body})))",
            "i32 ".repeat(params),
            "i32 ".repeat(locals)
        );
        wat::parse_str(&text).expect("a valid component")
    }

    /// Parameters are locals to the compiler: a function with 1,000 of them (the most wasm
    /// allows) and no declared locals under 40 loops is the same bomb as 1,000 locals.
    #[test]
    fn parameters_count_as_locals() {
        let shape = check_shape(&component(1000, 0, 8)).expect("within the bounds");
        assert_eq!(shape.most_locals, 1000);
        let err = check_shape(&component(1000, 0, 40)).unwrap_err();
        assert!(
            err.to_string()
                .contains("nests loops 40 deep over 1000 locals"),
            "{err}"
        );
        assert!(check_shape(&component(0, 0, 40)).is_ok());
    }
}
