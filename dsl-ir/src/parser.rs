//! Reads the text form written by [`crate::printer`] back into a [`Function`].
//!
//! The parser checks syntax and name binding only: every value is defined once and every
//! used name is defined somewhere in the function (uses may precede definitions, so texts
//! that violate dominance can be written to test the verifier). Operand and result types
//! are not checked against each other; that is [`crate::verify`]'s job.
//!
//! Beyond the printer's output the parser accepts `// comments` to the end of a line,
//! blank lines, extra spaces, and line breaks inside the parameter list. It never panics:
//! every malformed input gives a [`ParseError`] with the line and column of the problem.

use std::collections::HashMap;
use std::sync::Arc;

use crate::ir::{
    AtomicOp, BinaryOp, CmpPred, ConstValue, Function, HintKind, MemOrder, MemScope, Op, OpKind,
    Param, ParamAttrs, ReduceOp, Region, ScaledFormat, SignalOp, Span, UnaryOp, ValueData, ValueId,
};
use crate::types::{AddrSpace, Elem, ScalarType, Type};

/// Regions nested deeper than this are rejected (instead of overflowing the stack).
const MAX_DEPTH: usize = 256;

/// A syntax or name-binding error in IR text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{col}: {message}")]
pub struct ParseError {
    /// 1-based line in the text.
    pub line: u32,
    /// 1-based column (in characters) in the line.
    pub col: u32,
    /// What is wrong.
    pub message: String,
}

/// Parses a function printed by [`crate::printer::print_function`].
///
/// Values get fresh ids in order of first mention (parameters first); parameters keep
/// their printed names, other values get no name. A missing `loc(...)` gives
/// [`Span::unknown`].
pub fn parse_function(text: &str) -> Result<Function, ParseError> {
    let mut p = Parser {
        src: text,
        b: text.as_bytes(),
        pos: 0,
        func: Function::new("", Span::unknown()),
        names: HashMap::new(),
        defined: Vec::new(),
        first_use: Vec::new(),
        files: HashMap::new(),
        depth: 0,
    };
    p.function()?;
    Ok(p.func)
}

type PResult<T> = Result<T, ParseError>;

struct Parser<'a> {
    src: &'a str,
    b: &'a [u8],
    pos: usize,
    func: Function,
    /// Printed name (without `%`) to value.
    names: HashMap<String, ValueId>,
    /// Per value id: whether a definition has been seen.
    defined: Vec<bool>,
    /// Per value id: position and name of its first mention.
    first_use: Vec<(usize, String)>,
    /// Interned file names of spans.
    files: HashMap<String, Arc<str>>,
    depth: usize,
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn is_literal_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'+' | b'-')
}

impl Parser<'_> {
    // ----- low level -----

    fn err_at(&self, pos: usize, message: impl Into<String>) -> ParseError {
        let pos = pos.min(self.b.len());
        let before = &self.b[..pos];
        let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |i| i + 1);
        let col = self
            .src
            .get(line_start..pos)
            .map_or(pos - line_start, |s| s.chars().count())
            + 1;
        ParseError {
            line: u32::try_from(line).unwrap_or(u32::MAX),
            col: u32::try_from(col).unwrap_or(u32::MAX),
            message: message.into(),
        }
    }

    fn err(&self, message: impl Into<String>) -> ParseError {
        self.err_at(self.pos, message)
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    /// A description of what is at the cursor, for messages.
    fn found(&self) -> String {
        match self.src.get(self.pos..).and_then(|s| s.chars().next()) {
            None => "end of input".to_string(),
            Some('\n') => "end of line".to_string(),
            Some(c) => format!("`{c}`"),
        }
    }

    fn expected(&self, what: &str) -> ParseError {
        self.err(format!("expected {what}, found {}", self.found()))
    }

    /// Skips spaces, tabs, carriage returns and `//` comments, not line breaks.
    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\r' => self.pos += 1,
                b'/' if self.b.get(self.pos + 1) == Some(&b'/') => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    /// Skips white space including line breaks.
    fn skip_ws_nl(&mut self) {
        loop {
            self.skip_ws();
            if self.peek() == Some(b'\n') {
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    /// Skips spaces; consumes `c` if it comes next.
    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> PResult<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.expected(&format!("`{}`", c as char)))
        }
    }

    /// The end of a line (or of the input).
    fn expect_eol(&mut self) -> PResult<()> {
        self.skip_ws();
        match self.peek() {
            None => Ok(()),
            Some(b'\n') => {
                self.pos += 1;
                Ok(())
            }
            _ => Err(self.expected("end of line")),
        }
    }

    /// The identifier at the cursor (after spaces), if any; not consumed.
    fn peek_word(&mut self) -> &str {
        self.skip_ws();
        let start = self.pos;
        let mut end = start;
        while self.b.get(end).copied().is_some_and(is_ident_char) {
            end += 1;
        }
        self.src.get(start..end).unwrap_or("")
    }

    /// Consumes the identifier `w` if it comes next.
    fn eat_word(&mut self, w: &str) -> bool {
        if self.peek_word() == w {
            self.pos += w.len();
            true
        } else {
            false
        }
    }

    fn expect_word(&mut self, w: &str) -> PResult<()> {
        if self.eat_word(w) {
            Ok(())
        } else {
            Err(self.expected(&format!("`{w}`")))
        }
    }

    /// An identifier (`[A-Za-z0-9_]+`) described as `what` in errors.
    fn word(&mut self, what: &str) -> PResult<String> {
        let w = self.peek_word().to_string();
        if w.is_empty() {
            return Err(self.expected(what));
        }
        self.pos += w.len();
        Ok(w)
    }

    /// A keyword from a fixed set, e.g. a predicate or memory order.
    fn keyword<T: Copy>(
        &mut self,
        what: &str,
        all: &[T],
        name: fn(T) -> &'static str,
    ) -> PResult<T> {
        self.skip_ws();
        let start = self.pos;
        let w = self.word(what)?;
        all.iter().copied().find(|&t| name(t) == w).ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|&t| name(t)).collect();
            self.err_at(
                start,
                format!(
                    "unknown {what} `{w}` (expected one of: {})",
                    names.join(", ")
                ),
            )
        })
    }

    /// A decimal integer with an optional `-`.
    fn int(&mut self, what: &str) -> PResult<i64> {
        self.skip_ws();
        let start = self.pos;
        let neg = self.peek() == Some(b'-');
        if neg {
            self.pos += 1;
        }
        if !self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos = start;
            return Err(self.expected(what));
        }
        let mut v: i128 = 0;
        while let Some(c) = self.peek().filter(|c| c.is_ascii_digit()) {
            v = v * 10 + i128::from(c - b'0');
            if v > i128::from(u64::MAX) {
                return Err(self.err_at(start, format!("{what} is out of range")));
            }
            self.pos += 1;
        }
        let v = if neg { -v } else { v };
        i64::try_from(v).map_err(|_| self.err_at(start, format!("{what} is out of range")))
    }

    /// An integer that must fit `T`.
    fn small_int<T: TryFrom<i64>>(&mut self, what: &str) -> PResult<T> {
        self.skip_ws();
        let start = self.pos;
        let v = self.int(what)?;
        T::try_from(v).map_err(|_| self.err_at(start, format!("{what} {v} is out of range")))
    }

    /// A double-quoted string with the printer's escapes.
    fn string(&mut self) -> PResult<String> {
        self.skip_ws();
        let start = self.pos;
        if self.peek() != Some(b'"') {
            return Err(self.expected("a string"));
        }
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.src.get(self.pos..).and_then(|s| s.chars().next()) else {
                return Err(self.err_at(start, "unterminated string"));
            };
            match c {
                '"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                '\n' => return Err(self.err_at(start, "unterminated string")),
                '\\' => {
                    let esc_pos = self.pos;
                    self.pos += 1;
                    let e = self.peek();
                    self.pos += 1;
                    match e {
                        Some(b'\\') => out.push('\\'),
                        Some(b'"') => out.push('"'),
                        Some(b'n') => out.push('\n'),
                        Some(b'r') => out.push('\r'),
                        Some(b't') => out.push('\t'),
                        Some(b'u') => {
                            if self.peek() != Some(b'{') {
                                return Err(self.err_at(esc_pos, "expected `\\u{...}`"));
                            }
                            self.pos += 1;
                            let hs = self.pos;
                            while self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                                self.pos += 1;
                            }
                            let hex = self.src.get(hs..self.pos).unwrap_or("");
                            let ch = u32::from_str_radix(hex, 16)
                                .ok()
                                .and_then(char::from_u32)
                                .ok_or_else(|| self.err_at(esc_pos, "invalid `\\u{...}` escape"))?;
                            if self.peek() != Some(b'}') {
                                return Err(self.err_at(esc_pos, "expected `}` in `\\u{...}`"));
                            }
                            self.pos += 1;
                            out.push(ch);
                        }
                        _ => return Err(self.err_at(esc_pos, "unknown escape in string")),
                    }
                }
                c => {
                    out.push(c);
                    self.pos += c.len_utf8();
                }
            }
        }
    }

    // ----- values -----

    fn value_name(&mut self) -> PResult<(usize, String)> {
        self.skip_ws();
        let start = self.pos;
        if self.peek() != Some(b'%') {
            return Err(self.expected("a value (`%name`)"));
        }
        self.pos += 1;
        let s = self.pos;
        while self.peek().is_some_and(is_ident_char) {
            self.pos += 1;
        }
        if s == self.pos {
            return Err(self.err_at(start, "expected a value name after `%`"));
        }
        Ok((start, self.src.get(s..self.pos).unwrap_or("").to_string()))
    }

    fn lookup_or_create(&mut self, pos: usize, name: &str) -> ValueId {
        if let Some(&v) = self.names.get(name) {
            return v;
        }
        let v = self.func.new_value(Type::scalar(ScalarType::I1));
        self.names.insert(name.to_string(), v);
        self.defined.push(false);
        self.first_use.push((pos, name.to_string()));
        v
    }

    /// A use of a value (which may be defined later).
    fn use_value(&mut self) -> PResult<ValueId> {
        let (pos, name) = self.value_name()?;
        Ok(self.lookup_or_create(pos, &name))
    }

    /// A definition of a value; its type is set by [`Parser::set_type`].
    fn def_value(&mut self) -> PResult<ValueId> {
        let (pos, name) = self.value_name()?;
        let v = self.lookup_or_create(pos, &name);
        if self.defined[v.index()] {
            return Err(self.err_at(pos, format!("value `%{name}` is defined twice")));
        }
        self.defined[v.index()] = true;
        Ok(v)
    }

    fn set_type(&mut self, v: ValueId, ty: Type) {
        if let Some(d) = self.func.values.get_mut(v.index()) {
            d.ty = ty;
        }
    }

    /// `%a, %b, ...`: zero or more uses (none unless a `%` comes next).
    fn operand_list(&mut self) -> PResult<Vec<ValueId>> {
        let mut vs = Vec::new();
        self.skip_ws();
        if self.peek() != Some(b'%') {
            return Ok(vs);
        }
        loop {
            vs.push(self.use_value()?);
            if !self.eat(b',') {
                return Ok(vs);
            }
        }
    }

    // ----- types -----

    fn scalar_type(&mut self) -> PResult<ScalarType> {
        self.keyword("scalar type", &ScalarType::ALL, ScalarType::name)
    }

    fn elem(&mut self) -> PResult<Elem> {
        if self.eat_word("ptr") {
            self.expect(b'<')?;
            let pointee = self.scalar_type()?;
            let space = if self.eat(b',') {
                self.keyword(
                    "address space",
                    &[AddrSpace::Global, AddrSpace::Shared],
                    AddrSpace::name,
                )?
            } else {
                AddrSpace::Global
            };
            self.expect(b'>')?;
            Ok(Elem::Ptr { pointee, space })
        } else {
            Ok(Elem::Scalar(self.scalar_type()?))
        }
    }

    fn ty(&mut self) -> PResult<Type> {
        if !self.eat(b'<') {
            return Ok(Type {
                elem: self.elem()?,
                shape: Vec::new(),
            });
        }
        let mut shape = Vec::new();
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            shape.push(self.small_int::<u32>("dimension")?);
            if self.peek() != Some(b'x') {
                return Err(self.expected("`x` after a dimension"));
            }
            self.pos += 1;
        }
        let elem = self.elem()?;
        self.expect(b'>')?;
        Ok(Type { elem, shape })
    }

    fn type_list(&mut self) -> PResult<Vec<Type>> {
        let mut tys = vec![self.ty()?];
        while self.eat(b',') {
            tys.push(self.ty()?);
        }
        Ok(tys)
    }

    // ----- structure -----

    /// An optional ` loc("file":line:col)`.
    fn loc(&mut self) -> PResult<Span> {
        if !self.eat_word("loc") {
            return Ok(Span::unknown());
        }
        self.expect(b'(')?;
        let file = self.string()?;
        self.expect(b':')?;
        let line = self.small_int::<u32>("line number")?;
        self.expect(b':')?;
        let col = self.small_int::<u32>("column number")?;
        self.expect(b')')?;
        let file = match self.files.get(&file) {
            Some(f) => f.clone(),
            None => {
                let f: Arc<str> = Arc::from(file.as_str());
                self.files.insert(file, f.clone());
                f
            }
        };
        Ok(Span { file, line, col })
    }

    fn function(&mut self) -> PResult<()> {
        self.skip_ws_nl();
        self.expect_word("kernel")?;
        self.expect(b'@')?;
        self.skip_ws();
        self.func.name = if self.peek() == Some(b'"') {
            self.string()?
        } else {
            self.word("a kernel name")?
        };
        self.expect(b'(')?;
        self.skip_ws_nl();
        if !self.eat(b')') {
            loop {
                self.skip_ws_nl();
                self.param()?;
                self.skip_ws_nl();
                if self.eat(b')') {
                    break;
                }
                self.expect(b',')?;
            }
        }
        self.func.span = self.loc()?;
        self.expect(b'{')?;
        self.func.body = self.region()?;
        self.skip_ws_nl();
        if self.peek().is_some() {
            return Err(self.expected("end of input after the kernel"));
        }
        self.check_all_defined()
    }

    fn param(&mut self) -> PResult<()> {
        let (pos, name) = self.value_name()?;
        if self.names.contains_key(&name) {
            return Err(self.err_at(pos, format!("parameter `%{name}` is declared twice")));
        }
        let v = self.lookup_or_create(pos, &name);
        self.defined[v.index()] = true;
        self.expect(b':')?;
        let ty = self.ty()?;
        if let Some(d) = self.func.values.get_mut(v.index()) {
            *d = ValueData {
                ty,
                name: Some(name.clone()),
            };
        }
        let mut attrs = ParamAttrs::default();
        if self.eat(b'{') {
            loop {
                let start = self.pos;
                match self.word("a parameter attribute")?.as_str() {
                    "readonly" => attrs.readonly = true,
                    "within_2gib" => attrs.within_2gib = true,
                    "tensor_map" => attrs.tensor_map = true,
                    "equal_to_1" => attrs.equal_to_one = true,
                    "no_specialize" => attrs.no_specialize = true,
                    "div" => {
                        self.expect(b'=')?;
                        attrs.divisibility = Some(self.small_int::<u32>("divisibility")?);
                    }
                    w => {
                        return Err(self.err_at(
                            start,
                            format!(
                                "unknown parameter attribute `{w}` (expected `readonly`, `div=N`, `within_2gib`, `tensor_map`, `equal_to_1` or `no_specialize`)"
                            ),
                        ));
                    }
                }
                if self.eat(b'}') {
                    break;
                }
                self.expect(b',')?;
            }
        }
        self.func.params.push(Param {
            name,
            value: v,
            attrs,
        });
        Ok(())
    }

    fn check_all_defined(&self) -> PResult<()> {
        let undefined = self
            .defined
            .iter()
            .zip(&self.first_use)
            .filter(|(d, _)| !**d)
            .map(|(_, u)| u)
            .min_by_key(|(pos, _)| *pos);
        match undefined {
            Some((pos, name)) => {
                Err(self.err_at(*pos, format!("use of undefined value `%{name}`")))
            }
            None => Ok(()),
        }
    }

    /// A region after its `{`, up to and including its `}`.
    fn region(&mut self) -> PResult<Region> {
        if self.depth >= MAX_DEPTH {
            return Err(self.err(format!("regions nested deeper than {MAX_DEPTH}")));
        }
        self.depth += 1;
        self.expect_eol()?;
        self.skip_ws_nl();
        let mut region = Region::default();
        if self.eat(b'^') {
            self.expect(b'(')?;
            if !self.eat(b')') {
                loop {
                    let v = self.def_value()?;
                    self.expect(b':')?;
                    let ty = self.ty()?;
                    self.set_type(v, ty);
                    region.args.push(v);
                    if self.eat(b')') {
                        break;
                    }
                    self.expect(b',')?;
                }
            }
            self.expect(b':')?;
            self.expect_eol()?;
        }
        loop {
            self.skip_ws_nl();
            match self.peek() {
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                None => return Err(self.expected("`}`")),
                Some(b'^') => {
                    return Err(self.err("region arguments must come before the first op"));
                }
                Some(_) => {
                    let op = self.op()?;
                    region.ops.push(op);
                }
            }
        }
        self.depth -= 1;
        Ok(region)
    }

    fn op(&mut self) -> PResult<Op> {
        let mut results = Vec::new();
        if self.peek() == Some(b'%') {
            loop {
                results.push(self.def_value()?);
                if !self.eat(b',') {
                    break;
                }
            }
            self.expect(b'=')?;
        }
        self.skip_ws();
        let mnemonic_pos = self.pos;
        let mnemonic = self.word("an op mnemonic")?;
        let mut kind = self.kind(&mnemonic, mnemonic_pos)?;
        let mut operands = self.operand_list()?;
        if matches!(kind, OpKind::For) && self.eat_word("iter") {
            self.expect(b'(')?;
            if !self.eat(b')') {
                loop {
                    operands.push(self.use_value()?);
                    if self.eat(b')') {
                        break;
                    }
                    self.expect(b',')?;
                }
            }
        }
        self.set_mask_flags(&mut kind, operands.len(), mnemonic_pos)?;
        self.skip_ws();
        let types_pos = self.pos;
        if self.eat(b':') {
            let tys = self.type_list()?;
            if tys.len() != results.len() {
                return Err(self.err_at(
                    types_pos,
                    format!(
                        "{} result type(s) given for {} result(s)",
                        tys.len(),
                        results.len()
                    ),
                ));
            }
            for (&v, t) in results.iter().zip(tys) {
                self.set_type(v, t);
            }
        } else if !results.is_empty() {
            return Err(self.expected("`:` and the result types"));
        }
        let span = self.loc()?;
        let mut regions = Vec::new();
        if self.eat(b'{') {
            loop {
                regions.push(self.region()?);
                let sep = !self.peek_word().is_empty();
                if sep {
                    let w = self.word("a region separator")?;
                    if w != "else" && w != "do" {
                        return Err(self.err(format!(
                            "unexpected `{w}` after a region (expected `else`, `do` or `{{`)"
                        )));
                    }
                }
                if self.eat(b'{') {
                    continue;
                }
                if sep {
                    return Err(self.expected("`{`"));
                }
                break;
            }
        }
        self.expect_eol()?;
        Ok(Op {
            kind,
            operands,
            results,
            regions,
            span,
        })
    }

    /// The op kind for `mnemonic`, reading its attributes. Mask flags are set later.
    fn kind(&mut self, mnemonic: &str, pos: usize) -> PResult<OpKind> {
        if let Some(op) = BinaryOp::ALL.into_iter().find(|o| o.name() == mnemonic) {
            return Ok(OpKind::Binary(op));
        }
        if let Some(op) = UnaryOp::ALL.into_iter().find(|o| o.name() == mnemonic) {
            return Ok(OpKind::Unary(op));
        }
        Ok(match mnemonic {
            "program_id" => OpKind::ProgramId {
                axis: self.small_int("grid axis")?,
            },
            "num_programs" => OpKind::NumPrograms {
                axis: self.small_int("grid axis")?,
            },
            "const" => OpKind::Const(self.const_value()?),
            "arange" => {
                let start = self.int("arange start")?;
                self.expect(b',')?;
                let end = self.int("arange end")?;
                OpKind::Arange { start, end }
            }
            "local_alloc" => OpKind::LocalAlloc {
                len: self.small_int("local_alloc length")?,
            },
            "print" => OpKind::Print {
                prefix: self.string()?,
            },
            "assert" => OpKind::Assert {
                message: self.string()?,
            },
            "splat" => OpKind::Splat,
            "broadcast" => OpKind::Broadcast,
            "expand_dims" => OpKind::ExpandDims { axis: self.axis()? },
            "reshape" => OpKind::Reshape,
            "permute" => {
                self.expect_word("order")?;
                self.expect(b'=')?;
                self.expect(b'[')?;
                let mut order = Vec::new();
                if !self.eat(b']') {
                    loop {
                        order.push(self.small_int("permutation index")?);
                        if self.eat(b']') {
                            break;
                        }
                        self.expect(b',')?;
                    }
                }
                OpKind::Permute { order }
            }
            "hint" => {
                let kind = self.keyword("hint kind", &HintKind::ALL, HintKind::name)?;
                self.expect(b'=')?;
                self.expect(b'[')?;
                let mut values = Vec::new();
                if !self.eat(b']') {
                    loop {
                        values.push(self.small_int("hint value")?);
                        if self.eat(b']') {
                            break;
                        }
                        self.expect(b',')?;
                    }
                }
                OpKind::Hint { kind, values }
            }
            "fma" => OpKind::Fma,
            "cmp" => {
                OpKind::Cmp(self.keyword("comparison predicate", &CmpPred::ALL, CmpPred::name)?)
            }
            "select" => OpKind::Select,
            "cast" => OpKind::Cast,
            "bitcast" => OpKind::Bitcast,
            "addptr" => OpKind::AddPtr,
            "load" => OpKind::Load {
                has_mask: false,
                has_other: false,
            },
            "store" => OpKind::Store { has_mask: false },
            "desc_load" | "desc_store" => {
                self.expect_word("rank")?;
                self.expect(b'=')?;
                let rank = self.small_int("rank")?;
                if mnemonic == "desc_load" {
                    OpKind::DescLoad {
                        rank,
                        has_pred: false,
                    }
                } else {
                    OpKind::DescStore { rank }
                }
            }
            "atomic_rmw" => OpKind::AtomicRmw {
                op: self.keyword("atomic op", &AtomicOp::ALL, AtomicOp::name)?,
                order: self.keyword("memory order", &MemOrder::ALL, MemOrder::name)?,
                scope: self.keyword("memory scope", &MemScope::ALL, MemScope::name)?,
                has_mask: false,
            },
            "atomic_cas" => OpKind::AtomicCas {
                order: self.keyword("memory order", &MemOrder::ALL, MemOrder::name)?,
                scope: self.keyword("memory scope", &MemScope::ALL, MemScope::name)?,
                has_mask: false,
            },
            "dot" => OpKind::Dot,
            "dot_scaled" => OpKind::DotScaled {
                format: self.keyword("format", &ScaledFormat::ALL, ScaledFormat::name)?,
            },
            "reduce" => {
                let op = self.keyword("reduction", &ReduceOp::ALL, ReduceOp::name)?;
                OpKind::Reduce {
                    op,
                    axis: self.axis()?,
                }
            }
            "scan" => {
                let op = self.keyword("reduction", &ReduceOp::ALL, ReduceOp::name)?;
                let axis = self.axis()?;
                let reverse = self.eat_word("reverse");
                OpKind::Scan { axis, op, reverse }
            }
            "for" => OpKind::For,
            "if" => OpKind::If,
            "while" => OpKind::While,
            "yield" => OpKind::Yield,
            "condition" => OpKind::Condition,
            "barrier" => OpKind::Barrier,
            "rank" => OpKind::Rank,
            "world_size" => OpKind::WorldSize,
            "remote_ptr" => OpKind::RemotePtr,
            "signal" => OpKind::Signal {
                op: self.keyword("signal op", &SignalOp::ALL, SignalOp::name)?,
                order: self.keyword("memory order", &MemOrder::ALL, MemOrder::name)?,
                scope: self.keyword("memory scope", &MemScope::ALL, MemScope::name)?,
            },
            "wait_until" => OpKind::WaitUntil {
                pred: self.keyword("comparison predicate", &CmpPred::ALL, CmpPred::name)?,
                scope: self.keyword("memory scope", &MemScope::ALL, MemScope::name)?,
            },
            "fence" => OpKind::Fence {
                order: self.keyword("memory order", &MemOrder::ALL, MemOrder::name)?,
                scope: self.keyword("memory scope", &MemScope::ALL, MemScope::name)?,
            },
            "barrier_all" => OpKind::BarrierAll,
            other => return Err(self.err_at(pos, format!("unknown op `{other}`"))),
        })
    }

    /// `axis=N`.
    fn axis(&mut self) -> PResult<u8> {
        self.expect_word("axis")?;
        self.expect(b'=')?;
        self.small_int("axis")
    }

    /// Sets the mask flags of memory ops from their operand count.
    fn set_mask_flags(&self, kind: &mut OpKind, n: usize, pos: usize) -> PResult<()> {
        let mnemonic = kind.mnemonic();
        let bad =
            |range: &str| self.err_at(pos, format!("`{mnemonic}` takes {range} operands, got {n}"));
        match kind {
            OpKind::Load {
                has_mask,
                has_other,
            } => {
                if !(1..=3).contains(&n) {
                    return Err(bad("1 to 3"));
                }
                *has_mask = n >= 2;
                *has_other = n == 3;
            }
            OpKind::Store { has_mask } | OpKind::AtomicRmw { has_mask, .. } => {
                if !(2..=3).contains(&n) {
                    return Err(bad("2 or 3"));
                }
                *has_mask = n == 3;
            }
            OpKind::DescLoad { rank, has_pred } => {
                *has_pred = n == 3 * *rank as usize + 2;
            }
            OpKind::AtomicCas { has_mask, .. } => {
                if !(3..=4).contains(&n) {
                    return Err(bad("3 or 4"));
                }
                *has_mask = n == 4;
            }
            _ => {}
        }
        Ok(())
    }

    /// A constant literal: `true`, `false`, an integer, or a float (`1.5`, `1e-7`,
    /// `-0.0`, `inf`, `-inf`, `nan`, `nan(0x<bits>)`).
    fn const_value(&mut self) -> PResult<ConstValue> {
        self.skip_ws();
        let start = self.pos;
        while self.peek().is_some_and(is_literal_char) {
            self.pos += 1;
        }
        let word = self.src.get(start..self.pos).unwrap_or("");
        let bad = |p: &Self| p.err_at(start, format!("invalid constant `{word}`"));
        Ok(match word {
            "" => return Err(self.expected("a constant")),
            "true" => ConstValue::Bool(true),
            "false" => ConstValue::Bool(false),
            "inf" => ConstValue::Float(f64::INFINITY),
            "-inf" => ConstValue::Float(f64::NEG_INFINITY),
            "nan" => {
                if self.peek() != Some(b'(') {
                    return Ok(ConstValue::Float(f64::NAN));
                }
                self.pos += 1;
                if !self.eat_word_prefix("0x") {
                    return Err(self.expected("`0x` and the NaN's bits"));
                }
                let hs = self.pos;
                while self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                    self.pos += 1;
                }
                let bits = self
                    .src
                    .get(hs..self.pos)
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .ok_or_else(|| self.err_at(hs, "expected the NaN's bits in hex"))?;
                if self.peek() != Some(b')') {
                    return Err(self.expected("`)`"));
                }
                self.pos += 1;
                let x = f64::from_bits(bits);
                if !x.is_nan() {
                    return Err(self.err_at(hs, format!("0x{bits:016x} is not a NaN")));
                }
                ConstValue::Float(x)
            }
            w if w.contains(['.', 'e', 'E']) => {
                let x: f64 = w.parse().map_err(|_| bad(self))?;
                if !x.is_finite() {
                    return Err(bad(self));
                }
                ConstValue::Float(x)
            }
            w => {
                let v: i128 = w.parse().map_err(|_| bad(self))?;
                if let Ok(i) = i64::try_from(v) {
                    ConstValue::Int(i)
                } else if let Ok(u) = u64::try_from(v) {
                    // Unsigned 64-bit values are stored by their bit pattern.
                    ConstValue::Int(u as i64)
                } else {
                    return Err(self.err_at(start, format!("constant `{w}` is out of range")));
                }
            }
        })
    }

    /// Consumes the exact bytes `s` if they come next (no space skipping).
    fn eat_word_prefix(&mut self, s: &str) -> bool {
        if self.b.get(self.pos..self.pos + s.len()) == Some(s.as_bytes()) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::mem::discriminant;

    use super::*;
    use crate::builder::FunctionBuilder;
    use crate::printer::print_function;

    fn sp(line: u32, col: u32) -> Span {
        Span::new("tests/kernels.rs", line, col)
    }

    fn i32t() -> Type {
        Type::scalar(ScalarType::I32)
    }

    fn tile(s: ScalarType, shape: &[u32]) -> Type {
        Type::tile(s, shape)
    }

    fn ptr_tile(pointee: ScalarType, shape: &[u32]) -> Type {
        Type::global_ptr(pointee).with_shape(shape)
    }

    /// Every kind without regions, control flow, masked and unmasked memory ops.
    fn kitchen_sink() -> Function {
        use ScalarType::*;
        let mut b = FunctionBuilder::new("kitchen_sink", sp(1, 1));
        let x = b.param(
            "x",
            Type::global_ptr(F32),
            ParamAttrs {
                readonly: true,
                divisibility: Some(16),
                within_2gib: true,
                tensor_map: false,
                ..ParamAttrs::default()
            },
        );
        let out = b.param("out", Type::global_ptr(F32), ParamAttrs::default());
        let cnt = b.param(
            "cnt",
            Type::global_ptr(I32),
            ParamAttrs {
                readonly: false,
                divisibility: Some(4),
                within_2gib: false,
                tensor_map: false,
                ..ParamAttrs::default()
            },
        );
        let n = b.param(
            "n",
            i32t(),
            ParamAttrs {
                no_specialize: true,
                ..ParamAttrs::default()
            },
        );
        let _unit = b.param(
            "unit",
            i32t(),
            ParamAttrs {
                divisibility: Some(16),
                equal_to_one: true,
                ..ParamAttrs::default()
            },
        );
        let sh = b.param(
            "smem",
            Type {
                elem: Elem::Ptr {
                    pointee: U64,
                    space: AddrSpace::Shared,
                },
                shape: vec![],
            },
            ParamAttrs::default(),
        );
        let pid = b
            .op1(OpKind::ProgramId { axis: 0 }, &[], None, sp(3, 5))
            .unwrap();
        let _np = b
            .op1(OpKind::NumPrograms { axis: 2 }, &[], None, sp(4, 5))
            .unwrap();
        let r = b
            .op1(OpKind::Arange { start: 0, end: 128 }, &[], None, sp(5, 5))
            .unwrap();
        let t128 = tile(I32, &[128]);
        let s = b.op1(OpKind::Splat, &[pid], Some(&t128), sp(6, 5)).unwrap();
        let r = b
            .op1(
                OpKind::Hint {
                    kind: HintKind::MaxContiguous,
                    values: vec![128],
                },
                &[r],
                None,
                sp(6, 9),
            )
            .unwrap();
        let _h = b
            .op1(
                OpKind::Hint {
                    kind: HintKind::MultipleOf,
                    values: vec![24],
                },
                &[pid],
                None,
                sp(6, 11),
            )
            .unwrap();
        let off = b
            .op1(
                OpKind::Binary(BinaryOp::Add),
                &[s, r],
                None,
                Span::unknown(),
            )
            .unwrap();
        let ns = b
            .op1(OpKind::Splat, &[n], Some(&t128), Span::unknown())
            .unwrap();
        let mask = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[off, ns], None, sp(7, 9))
            .unwrap();
        // All binary ops on i32 tiles (`pow` on floats below), all predicates.
        let mut acc = off;
        for op in BinaryOp::ALL {
            if op == BinaryOp::Pow {
                continue;
            }
            acc = b
                .op1(OpKind::Binary(op), &[acc, r], None, Span::unknown())
                .unwrap();
        }
        for p in CmpPred::ALL {
            b.op1(OpKind::Cmp(p), &[acc, r], None, Span::unknown())
                .unwrap();
        }
        let px = b
            .op1(OpKind::Splat, &[x], Some(&t128), Span::unknown())
            .unwrap();
        let pxo = b
            .op1(OpKind::AddPtr, &[px, off], None, Span::unknown())
            .unwrap();
        let zero = b
            .constant(ConstValue::Float(0.0), tile(F32, &[128]), Span::unknown())
            .unwrap();
        let l0 = b
            .op1(
                OpKind::Load {
                    has_mask: false,
                    has_other: false,
                },
                &[pxo],
                None,
                sp(8, 1),
            )
            .unwrap();
        let l1 = b
            .op1(
                OpKind::Load {
                    has_mask: true,
                    has_other: false,
                },
                &[pxo, mask],
                None,
                sp(9, 1),
            )
            .unwrap();
        let l2 = b
            .op1(
                OpKind::Load {
                    has_mask: true,
                    has_other: true,
                },
                &[pxo, mask, zero],
                None,
                sp(10, 1),
            )
            .unwrap();
        // All unary ops on floats (and the integer ones on i32).
        let mut v = l0;
        for op in UnaryOp::ALL {
            if op == UnaryOp::Not || op.is_int_only() {
                b.op1(OpKind::Unary(op), &[acc], None, Span::unknown())
                    .unwrap();
                continue;
            }
            v = b
                .op1(OpKind::Unary(op), &[v], None, Span::unknown())
                .unwrap();
        }
        v = b
            .op1(
                OpKind::Binary(BinaryOp::Pow),
                &[v, l0],
                None,
                Span::unknown(),
            )
            .unwrap();
        let f = b
            .op1(OpKind::Fma, &[v, l1, l2], None, Span::unknown())
            .unwrap();
        let sel = b
            .op1(OpKind::Select, &[mask, f, l1], None, Span::unknown())
            .unwrap();
        let h = b
            .op1(
                OpKind::Cast,
                &[sel],
                Some(&tile(F16, &[128])),
                Span::unknown(),
            )
            .unwrap();
        let _bits = b
            .op1(
                OpKind::Bitcast,
                &[h],
                Some(&tile(U16, &[128])),
                Span::unknown(),
            )
            .unwrap();
        let po = b
            .op1(OpKind::Splat, &[out], Some(&t128), Span::unknown())
            .unwrap();
        let poo = b
            .op1(OpKind::AddPtr, &[po, off], None, Span::unknown())
            .unwrap();
        b.op(
            OpKind::Store { has_mask: true },
            &[poo, sel, mask],
            None,
            sp(11, 3),
        )
        .unwrap();
        b.op(
            OpKind::Store { has_mask: false },
            &[poo, f],
            None,
            sp(12, 3),
        )
        .unwrap();
        // Atomics.
        let pc = b
            .op1(OpKind::Splat, &[cnt], Some(&t128), Span::unknown())
            .unwrap();
        let one = b
            .constant(ConstValue::Int(1), t128.clone(), Span::unknown())
            .unwrap();
        let old = b
            .op1(
                OpKind::AtomicRmw {
                    op: AtomicOp::Add,
                    order: MemOrder::AcqRel,
                    scope: MemScope::Device,
                    has_mask: true,
                },
                &[pc, one, mask],
                None,
                sp(13, 3),
            )
            .unwrap();
        for (i, op) in AtomicOp::ALL.into_iter().enumerate() {
            b.op1(
                OpKind::AtomicRmw {
                    op,
                    order: MemOrder::ALL[i % 4],
                    scope: MemScope::ALL[i % 3],
                    has_mask: false,
                },
                &[pc, old],
                None,
                Span::unknown(),
            )
            .unwrap();
        }
        b.op1(
            OpKind::AtomicCas {
                order: MemOrder::Release,
                scope: MemScope::System,
                has_mask: true,
            },
            &[pc, old, one, mask],
            None,
            Span::unknown(),
        )
        .unwrap();
        b.op1(
            OpKind::AtomicCas {
                order: MemOrder::Relaxed,
                scope: MemScope::Block,
                has_mask: false,
            },
            &[pc, old, one],
            None,
            Span::unknown(),
        )
        .unwrap();
        // Shape ops.
        let e = b
            .op1(OpKind::ExpandDims { axis: 1 }, &[l1], None, Span::unknown())
            .unwrap();
        let bc = b
            .op1(
                OpKind::Broadcast,
                &[e],
                Some(&tile(F32, &[128, 64])),
                Span::unknown(),
            )
            .unwrap();
        let pm = b
            .op1(
                OpKind::Permute { order: vec![1, 0] },
                &[bc],
                None,
                Span::unknown(),
            )
            .unwrap();
        let rs = b
            .op1(
                OpKind::Reshape,
                &[pm],
                Some(&tile(F32, &[64, 2, 64])),
                Span::unknown(),
            )
            .unwrap();
        let _rd = b
            .op1(
                OpKind::Reduce {
                    axis: 1,
                    op: ReduceOp::Sum,
                },
                &[rs],
                None,
                Span::unknown(),
            )
            .unwrap();
        let _sc = b
            .op1(
                OpKind::Scan {
                    axis: 0,
                    op: ReduceOp::Max,
                    reverse: true,
                },
                &[rs],
                None,
                Span::unknown(),
            )
            .unwrap();
        for op in ReduceOp::ALL {
            b.op1(
                OpKind::Scan {
                    axis: 0,
                    op,
                    reverse: false,
                },
                &[acc],
                None,
                Span::unknown(),
            )
            .unwrap();
        }
        // Dot on f16.
        let a16 = b
            .constant(
                ConstValue::Float(1.5),
                tile(F16, &[16, 32]),
                Span::unknown(),
            )
            .unwrap();
        let b16 = b
            .constant(
                ConstValue::Float(-0.25),
                tile(F16, &[32, 16]),
                Span::unknown(),
            )
            .unwrap();
        let c32 = b
            .constant(
                ConstValue::Float(0.0),
                tile(F32, &[16, 16]),
                Span::unknown(),
            )
            .unwrap();
        b.op1(OpKind::Dot, &[a16, b16, c32], None, sp(20, 7))
            .unwrap();
        // Shared memory: a pointer parameter, a block-local array and a block-scope
        // atomic on it, barrier.
        let _ = sh;
        let shared_u64 = Type {
            elem: Elem::Ptr {
                pointee: U64,
                space: AddrSpace::Shared,
            },
            shape: vec![],
        };
        let arr = b
            .op1(
                OpKind::LocalAlloc { len: 64 },
                &[],
                Some(&shared_u64),
                sp(21, 3),
            )
            .unwrap();
        let one_u64 = b
            .constant(ConstValue::Int(1), Type::scalar(U64), Span::unknown())
            .unwrap();
        b.op1(
            OpKind::AtomicRmw {
                op: AtomicOp::Add,
                order: MemOrder::Relaxed,
                scope: MemScope::Block,
                has_mask: false,
            },
            &[arr, one_u64],
            None,
            sp(21, 4),
        )
        .unwrap();
        b.op(OpKind::Barrier, &[], None, sp(21, 5)).unwrap();
        // Communication.
        let sig = b.param("sig", Type::global_ptr(U64), ParamAttrs::default());
        let r = b.op1(OpKind::Rank, &[], None, sp(22, 5)).unwrap();
        let w = b.op1(OpKind::WorldSize, &[], None, sp(22, 9)).unwrap();
        let one = b
            .constant(ConstValue::Int(1), Type::scalar(I32), Span::unknown())
            .unwrap();
        let r1 = b
            .op1(OpKind::Binary(BinaryOp::Add), &[r, one], None, sp(22, 11))
            .unwrap();
        let peer = b
            .op1(OpKind::Binary(BinaryOp::Rem), &[r1, w], None, sp(22, 13))
            .unwrap();
        let rsig = b
            .op1(OpKind::RemotePtr, &[sig, peer], None, sp(23, 5))
            .unwrap();
        let v = b
            .constant(ConstValue::Int(7), Type::scalar(U64), Span::unknown())
            .unwrap();
        b.op(
            OpKind::Signal {
                op: SignalOp::Add,
                order: MemOrder::Release,
                scope: MemScope::System,
            },
            &[rsig, v],
            None,
            sp(24, 5),
        )
        .unwrap();
        b.op1(
            OpKind::WaitUntil {
                pred: CmpPred::Ge,
                scope: MemScope::System,
            },
            &[sig, v],
            None,
            sp(25, 5),
        )
        .unwrap();
        b.op(
            OpKind::Fence {
                order: MemOrder::AcqRel,
                scope: MemScope::Device,
            },
            &[],
            None,
            sp(26, 5),
        )
        .unwrap();
        b.op(OpKind::BarrierAll, &[], None, sp(27, 5)).unwrap();
        b.finish()
    }

    /// Constants of every flavour, including the awkward floats.
    fn constants() -> Function {
        use ScalarType::*;
        let mut b = FunctionBuilder::new("consts", Span::unknown());
        let cases: Vec<(ConstValue, Type)> = vec![
            (ConstValue::Bool(true), Type::scalar(I1)),
            (ConstValue::Bool(false), tile(I1, &[4])),
            (ConstValue::Int(-1), Type::scalar(U64)),
            (ConstValue::Int(i64::MAX), Type::scalar(U64)),
            (ConstValue::Int(0), Type::scalar(U64)),
            (ConstValue::Int(i64::MIN), Type::scalar(I64)),
            (ConstValue::Int(255), Type::scalar(U8)),
            (ConstValue::Int(-7), tile(I8, &[2, 2])),
            (ConstValue::Int(42), Type::scalar(U32)),
            (ConstValue::Float(1.5), Type::scalar(F16)),
            (ConstValue::Float(-2.0), Type::scalar(BF16)),
            (ConstValue::Float(f64::NAN), Type::scalar(F32)),
            (ConstValue::Float(-f64::NAN), Type::scalar(F32)),
            (
                ConstValue::Float(f64::from_bits(0x7ff0_0000_0000_0001)),
                Type::scalar(F64),
            ),
            (ConstValue::Float(f64::INFINITY), Type::scalar(F32)),
            (ConstValue::Float(f64::NEG_INFINITY), tile(F16, &[8])),
            (ConstValue::Float(-0.0), Type::scalar(F64)),
            (ConstValue::Float(0.0), Type::scalar(F64)),
            (ConstValue::Float(0.1), Type::scalar(F64)),
            (ConstValue::Float(1e300), Type::scalar(F64)),
            (ConstValue::Float(1e21), Type::scalar(F64)),
            (ConstValue::Float(-5e-324), Type::scalar(F64)),
            (ConstValue::Float(f64::MAX), Type::scalar(F64)),
            (ConstValue::Float(123456789.0), Type::scalar(F32)),
            (ConstValue::Float(3.0), tile(F32, &[1])),
        ];
        for (i, (c, t)) in cases.into_iter().enumerate() {
            b.constant(c, t, Span::new("c.rs", i as u32 + 1, 3))
                .unwrap();
        }
        b.finish()
    }

    /// Nested `for` / `if` / `while` with iteration values.
    fn control_flow() -> Function {
        use ScalarType::*;
        let weird_file = "dir with space/we\"ird\\name\tü\u{1}.rs";
        let mut b = FunctionBuilder::new("control::flow", Span::new(weird_file, 1, 1));
        // Awkward parameter names: duplicate, leading digit, punctuation, empty.
        let p = b.param("a", Type::global_ptr(F32), ParamAttrs::default());
        let n = b.param("a", i32t(), ParamAttrs::default());
        let _q = b.param("0x", i32t(), ParamAttrs::default());
        let _r = b.param("a-b", i32t(), ParamAttrs::default());
        let _s = b.param("", i32t(), ParamAttrs::default());
        let _t = b.param("a_1", i32t(), ParamAttrs::default());
        let lb = b.const_i32(0, Span::new(weird_file, 2, 3)).unwrap();
        let st = b.const_i32(1, Span::unknown()).unwrap();
        let zero = b
            .constant(ConstValue::Float(0.0), tile(F32, &[4]), Span::unknown())
            .unwrap();
        let r = b
            .op1(
                OpKind::Arange { start: -2, end: 2 },
                &[],
                None,
                Span::unknown(),
            )
            .unwrap();
        let ps = b
            .op1(
                OpKind::Splat,
                &[p],
                Some(&ptr_tile(F32, &[4])),
                Span::unknown(),
            )
            .unwrap();
        let pp = b
            .op1(OpKind::AddPtr, &[ps, r], None, Span::unknown())
            .unwrap();
        // for iv in lb..n step st, iter(acc = zero, k = lb)
        let args = b.open_region(&[i32t(), tile(F32, &[4]), i32t()]);
        let (iv, acc, k) = (args[0], args[1], args[2]);
        let c = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[iv, n], None, Span::unknown())
            .unwrap();
        b.open_region(&[]);
        let x = b
            .op1(
                OpKind::Load {
                    has_mask: false,
                    has_other: false,
                },
                &[pp],
                None,
                Span::unknown(),
            )
            .unwrap();
        let y = b
            .op1(
                OpKind::Binary(BinaryOp::Add),
                &[acc, x],
                None,
                Span::unknown(),
            )
            .unwrap();
        // A for without iteration values nested in the `if`.
        b.open_region(&[i32t()]);
        b.op(
            OpKind::Store { has_mask: false },
            &[pp, y],
            None,
            Span::unknown(),
        )
        .unwrap();
        b.push_op(OpKind::Yield, vec![], vec![], vec![], Span::unknown());
        let inner = b.close_region();
        b.push_op(OpKind::For, vec![lb, n, st], vec![], vec![inner], sp(30, 9));
        b.push_op(OpKind::Yield, vec![y], vec![], vec![], sp(31, 9));
        let then_r = b.close_region();
        b.open_region(&[]);
        b.push_op(OpKind::Yield, vec![acc], vec![], vec![], Span::unknown());
        let else_r = b.close_region();
        let ifr = b.push_op(
            OpKind::If,
            vec![c],
            vec![tile(F32, &[4])],
            vec![then_r, else_r],
            sp(29, 5),
        );
        let k2 = b
            .op1(
                OpKind::Binary(BinaryOp::Add),
                &[k, st],
                None,
                Span::unknown(),
            )
            .unwrap();
        b.push_op(
            OpKind::Yield,
            vec![ifr[0], k2],
            vec![],
            vec![],
            Span::unknown(),
        );
        let body = b.close_region();
        let fr = b.push_op(
            OpKind::For,
            vec![lb, n, st, zero, lb],
            vec![tile(F32, &[4]), i32t()],
            vec![body],
            sp(28, 1),
        );
        // while (w < n) { w = w + 1 }, also carrying the loop result.
        let wa = b.open_region(&[i32t(), tile(F32, &[4])]);
        let wc = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[wa[0], n], None, Span::unknown())
            .unwrap();
        b.push_op(
            OpKind::Condition,
            vec![wc, wa[0], wa[1]],
            vec![],
            vec![],
            Span::unknown(),
        );
        let before = b.close_region();
        let wb = b.open_region(&[i32t(), tile(F32, &[4])]);
        let inc = b
            .op1(
                OpKind::Binary(BinaryOp::Add),
                &[wb[0], st],
                None,
                Span::unknown(),
            )
            .unwrap();
        b.push_op(
            OpKind::Yield,
            vec![inc, wb[1]],
            vec![],
            vec![],
            Span::unknown(),
        );
        let after = b.close_region();
        let wr = b.push_op(
            OpKind::While,
            vec![fr[1], fr[0]],
            vec![i32t(), tile(F32, &[4])],
            vec![before, after],
            sp(40, 2),
        );
        // An `if` without results.
        let c2 = b
            .op1(OpKind::Cmp(CmpPred::Eq), &[wr[0], n], None, Span::unknown())
            .unwrap();
        b.open_region(&[]);
        b.op(
            OpKind::Store { has_mask: false },
            &[pp, wr[1]],
            None,
            Span::unknown(),
        )
        .unwrap();
        b.push_op(OpKind::Yield, vec![], vec![], vec![], Span::unknown());
        let t = b.close_region();
        b.open_region(&[]);
        b.push_op(OpKind::Yield, vec![], vec![], vec![], Span::unknown());
        let e = b.close_region();
        b.push_op(OpKind::If, vec![c2], vec![], vec![t, e], Span::unknown());
        b.finish()
    }

    /// Checks the round trip: the print is a fixed point and the parsed function has the
    /// same structure, types, attributes and spans up to value numbering.
    fn round_trip(f: &Function) -> Function {
        let text = print_function(f);
        let g = parse_function(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(print_function(&g), text);
        assert_isomorphic(f, &g);
        g
    }

    fn assert_isomorphic(f: &Function, g: &Function) {
        assert_eq!(f.span, g.span);
        assert_eq!(f.name, g.name);
        assert_eq!(f.params.len(), g.params.len());
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        let bind = |a: ValueId, b: ValueId, map: &mut HashMap<ValueId, ValueId>| {
            assert_eq!(f.ty(a), g.ty(b));
            assert!(map.insert(a, b).is_none(), "{a} bound twice");
        };
        for (p, q) in f.params.iter().zip(&g.params) {
            assert_eq!(p.attrs, q.attrs);
            bind(p.value, q.value, &mut map);
        }
        fn defs(r: &Region, out: &mut Vec<ValueId>) {
            out.extend(&r.args);
            for op in &r.ops {
                out.extend(&op.results);
                for s in &op.regions {
                    defs(s, out);
                }
            }
        }
        let (mut df, mut dg) = (Vec::new(), Vec::new());
        defs(&f.body, &mut df);
        defs(&g.body, &mut dg);
        assert_eq!(df.len(), dg.len());
        for (&a, &b) in df.iter().zip(&dg) {
            bind(a, b, &mut map);
        }
        let (mut of, mut og) = (Vec::new(), Vec::new());
        f.walk(&mut |op| of.push(op.clone()));
        g.walk(&mut |op| og.push(op.clone()));
        assert_eq!(of.len(), og.len());
        for (a, b) in of.iter().zip(&og) {
            match (&a.kind, &b.kind) {
                (OpKind::Const(x), OpKind::Const(y)) => assert!(x.bit_eq(y), "{x:?} vs {y:?}"),
                (x, y) => assert_eq!(x, y),
            }
            assert_eq!(a.span, b.span);
            assert_eq!(a.regions.len(), b.regions.len());
            let mapped: Vec<ValueId> = a.operands.iter().map(|v| map[v]).collect();
            assert_eq!(mapped, b.operands);
        }
    }

    #[test]
    fn round_trips() {
        for f in [kitchen_sink(), constants(), control_flow()] {
            let g = round_trip(&f);
            // Parsing again from the parsed function's print is stable too.
            round_trip(&g);
        }
    }

    #[test]
    fn covers_every_op_kind() {
        let every = [
            OpKind::ProgramId { axis: 0 },
            OpKind::NumPrograms { axis: 0 },
            OpKind::Const(ConstValue::Int(0)),
            OpKind::Arange { start: 0, end: 1 },
            OpKind::Splat,
            OpKind::Broadcast,
            OpKind::ExpandDims { axis: 0 },
            OpKind::Reshape,
            OpKind::Permute { order: vec![] },
            OpKind::Hint {
                kind: HintKind::MultipleOf,
                values: vec![],
            },
            OpKind::Binary(BinaryOp::Add),
            OpKind::Unary(UnaryOp::Neg),
            OpKind::Fma,
            OpKind::Cmp(CmpPred::Eq),
            OpKind::Select,
            OpKind::Cast,
            OpKind::Bitcast,
            OpKind::AddPtr,
            OpKind::Load {
                has_mask: false,
                has_other: false,
            },
            OpKind::Store { has_mask: false },
            OpKind::AtomicRmw {
                op: AtomicOp::Add,
                order: MemOrder::Relaxed,
                scope: MemScope::Block,
                has_mask: false,
            },
            OpKind::AtomicCas {
                order: MemOrder::Relaxed,
                scope: MemScope::Block,
                has_mask: false,
            },
            OpKind::Dot,
            OpKind::Reduce {
                axis: 0,
                op: ReduceOp::Sum,
            },
            OpKind::Scan {
                axis: 0,
                op: ReduceOp::Sum,
                reverse: false,
            },
            OpKind::For,
            OpKind::If,
            OpKind::While,
            OpKind::Yield,
            OpKind::Condition,
            OpKind::Barrier,
            OpKind::LocalAlloc { len: 1 },
            OpKind::Rank,
            OpKind::WorldSize,
            OpKind::RemotePtr,
            OpKind::Signal {
                op: SignalOp::Set,
                order: MemOrder::Release,
                scope: MemScope::System,
            },
            OpKind::WaitUntil {
                pred: CmpPred::Eq,
                scope: MemScope::System,
            },
            OpKind::Fence {
                order: MemOrder::AcqRel,
                scope: MemScope::System,
            },
            OpKind::BarrierAll,
        ];
        let mut seen = Vec::new();
        let mut binary = Vec::new();
        let mut unary = Vec::new();
        for f in [kitchen_sink(), constants(), control_flow()] {
            f.walk(&mut |op| {
                seen.push(discriminant(&op.kind));
                match op.kind {
                    OpKind::Binary(b) => binary.push(b),
                    OpKind::Unary(u) => unary.push(u),
                    _ => {}
                }
            });
        }
        for k in &every {
            assert!(seen.contains(&discriminant(k)), "no test covers {k:?}");
        }
        assert!(BinaryOp::ALL.iter().all(|b| binary.contains(b)));
        assert!(UnaryOp::ALL.iter().all(|u| unary.contains(u)));
    }

    #[test]
    fn spans_round_trip() {
        let f = control_flow();
        let g = round_trip(&f);
        assert_eq!(&*g.span.file, "dir with space/we\"ird\\name\tü\u{1}.rs");
        assert_eq!(g.body.ops[0].span.line, 2);
        assert_eq!(g.body.ops[1].span, Span::unknown());
        assert_eq!(g.name, "control::flow");
        let names: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a", "a_1", "_0x", "a_b", "_", "a_1_1"]);
    }

    #[test]
    fn constants_are_bit_exact() {
        let f = constants();
        let g = round_trip(&f);
        let text = print_function(&f);
        for lit in [
            "const true : i1",
            "const 18446744073709551615 : u64",
            "const -9223372036854775808 : i64",
            "const nan : f32",
            "const nan(0xfff8000000000000) : f32",
            "const nan(0x7ff0000000000001) : f64",
            "const -inf : <8xf16>",
            "const -0.0 : f64",
            "const 0.0 : f64",
            "const 1e300 : f64",
            "const 1e21 : f64",
            "const 123456789.0 : f32",
            "const -5e-324 : f64",
        ] {
            assert!(text.contains(lit), "missing `{lit}` in\n{text}");
        }
        let mut cs = Vec::new();
        g.walk(&mut |op| {
            if let OpKind::Const(c) = op.kind {
                cs.push(c);
            }
        });
        assert_eq!(cs[2], ConstValue::Int(-1));
        assert!(matches!(cs[16], ConstValue::Float(x) if x == 0.0 && x.is_sign_negative()));
    }

    #[test]
    fn parse_error_reports_line_and_col() {
        let text = "kernel @k(%n: i32) {\n  %0 = const 1 : i32\n  %1 = frob %0 : i32\n}\n";
        let e = parse_function(text).unwrap_err();
        assert_eq!((e.line, e.col), (3, 8), "{e}");
        assert_eq!(e.to_string(), "3:8: unknown op `frob`");

        let text = "kernel @k(%n: i32) {\n  %0 = add %n, %7 : i32\n}\n";
        let e = parse_function(text).unwrap_err();
        assert_eq!((e.line, e.col), (2, 16), "{e}");
        assert!(e.message.contains("undefined value `%7`"), "{e}");

        let text = "kernel @k() {\n  %0 = const 1 : <4xi33>\n}\n";
        let e = parse_function(text).unwrap_err();
        assert_eq!((e.line, e.col), (2, 21), "{e}");

        let text = "kernel @k() {\n  %0 = const 1 : i32\n  %0 = const 2 : i32\n}\n";
        let e = parse_function(text).unwrap_err();
        assert_eq!((e.line, e.col), (3, 3), "{e}");
        assert!(e.message.contains("defined twice"), "{e}");

        let text = "kernel @k() {\n  %0, %1 = const 1 : i32\n}\n";
        let e = parse_function(text).unwrap_err();
        assert_eq!((e.line, e.col), (2, 20), "{e}");

        let e = parse_function("kernel @k() {\n").unwrap_err();
        assert_eq!((e.line, e.col), (2, 1), "{e}");
    }

    #[test]
    fn accepts_comments_blank_lines_and_forward_references() {
        let text = "// a comment\n\nkernel @k(\n  %n: i32 {div=8},\n  %p: ptr<f32> {readonly}\n) {\n\
                    \n  %a = add %b, %n : i32 // use before definition (the verifier rejects it)\n\
                    \x20 %b = const 1 : i32\n}\n";
        let f = parse_function(text).unwrap();
        assert_eq!(f.params[0].attrs.divisibility, Some(8));
        assert!(f.params[1].attrs.readonly);
        let printed = print_function(&f);
        assert_eq!(
            printed,
            "kernel @k(%n: i32 {div=8}, %p: ptr<f32> {readonly}) {\n  %0 = add %1, %n : i32\n  %1 = const 1 : i32\n}\n"
        );
        assert_eq!(print_function(&parse_function(&printed).unwrap()), printed);
    }

    /// Feeds every truncation and many byte-level mutations of valid texts to the
    /// parser: it must return (Ok or Err), never panic.
    #[test]
    fn never_panics_on_truncated_or_mutated_text() {
        let texts: Vec<String> = [kitchen_sink(), constants(), control_flow()]
            .iter()
            .map(print_function)
            .collect();
        for t in &texts {
            for (i, _) in t.char_indices() {
                let _ = parse_function(&t[..i]);
            }
        }
        let alphabet: &[u8] = b"%@^:,=(){}[]<>\"\\ \n\tx0123456789-.aeinflopz_/";
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for t in &texts {
            for _ in 0..1500 {
                let mut bytes = t.clone().into_bytes();
                for _ in 0..(1 + rnd() % 4) {
                    let at = (rnd() % bytes.len() as u64) as usize;
                    let c = alphabet[(rnd() % alphabet.len() as u64) as usize];
                    match rnd() % 3 {
                        0 => bytes[at] = c,
                        1 => {
                            bytes.remove(at);
                        }
                        _ => bytes.insert(at, c),
                    }
                }
                let s = String::from_utf8_lossy(&bytes);
                let _ = parse_function(&s);
            }
        }
        // Deep nesting is an error, not a stack overflow.
        let deep = format!("kernel @k() {{\n{}", "  if {\n".repeat(100_000));
        assert!(parse_function(&deep).is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(s in "\\PC*") {
            let _ = parse_function(&s);
        }

        #[test]
        fn grammar_like_text_never_panics(s in "[%@^:,=(){}<>\"\\\\ \nx0-9a-z_.-]{0,200}") {
            let _ = parse_function(&format!("kernel @k() {{\n{s}"));
        }
    }
}
