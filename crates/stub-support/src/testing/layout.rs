//! Checks `#[repr(C)]` mirrors of C structs against the installed headers: size, alignment,
//! and offset and size of every listed field, plus the values of constants.
//!
//! One table, built with [`layout_table!`](crate::layout_table), drives both sides: it
//! generates a C program that prints `offsetof`/`sizeof` from the headers, and it computes the
//! same numbers on the Rust side with `offset_of!`/`size_of`. [`check_tiling`] checks, without
//! the headers, that each Rust struct's listed top-level fields tile it with nothing but
//! alignment padding, so a field missing from the table is noticed.
//!
//! Table syntax, one entry per type:
//!
//! ```text
//! struct rdma_cm_id { verbs, channel, route, route.addr.src.src_addr => "route.addr.src_addr" }
//! union ibv_gid { raw, global, global.subnet_prefix }
//! struct sockaddr_storage (partial) { ss_family }
//! ```
//!
//! A path is a Rust field path; `=> "c.path"` gives the C member designator where it differs
//! (anonymous C unions, keywords). `(partial)` marks a type whose Rust definition has fields
//! the table cannot name (private padding in `libc`'s types): its size and the listed fields
//! are checked, the tiling is not.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use super::{run, skip, tools_present};

/// One field as Rust sees it.
#[derive(Debug)]
pub struct Field {
    /// The C member designator (`wr.rdma.rkey`, `imm_data`).
    pub c_path: &'static str,
    /// Offset of the field in its type.
    pub offset: usize,
    /// Size of the field.
    pub size: usize,
    /// The top-level Rust field this entry lies in, for the tiling check.
    pub top: &'static str,
    /// Offset, size and alignment of that top-level field.
    pub top_offset: usize,
    pub top_size: usize,
    pub top_align: usize,
}

/// One mirrored type.
#[derive(Debug)]
pub struct Type {
    /// `struct ibv_qp` / `union ibv_gid`.
    pub c_name: &'static str,
    /// A union: every field at offset 0.
    pub is_union: bool,
    /// Whether the listed fields are all the Rust type has (see the module documentation).
    pub exhaustive: bool,
    /// `size_of` and `align_of` the Rust type.
    pub size: usize,
    pub align: usize,
    /// The listed fields.
    pub fields: Vec<Field>,
}

/// `size_of` the type a raw pointer points to (used by [`layout_table!`](crate::layout_table)).
pub fn size_of_pointee<T>(_: *const T) -> usize {
    core::mem::size_of::<T>()
}

/// `align_of` the type a raw pointer points to (used by [`layout_table!`](crate::layout_table)).
pub fn align_of_pointee<T>(_: *const T) -> usize {
    core::mem::align_of::<T>()
}

/// Builds a `Vec<Type>` from a table of mirrored types (syntax: the module documentation of
/// `softverbs_stub_support::testing::layout`).
#[macro_export]
macro_rules! layout_table {
    ($( $kind:ident $ty:ident $(($partial:ident))? {
        $( $first:ident $(. $rest:ident)* $(=> $c:literal)? ),* $(,)?
    } )*) => {
        vec![$(
            $crate::testing::layout::Type {
                c_name: concat!(stringify!($kind), " ", stringify!($ty)),
                is_union: stringify!($kind) == "union",
                exhaustive: $crate::layout_table!(@exhaustive $($partial)?),
                size: ::core::mem::size_of::<$ty>(),
                align: ::core::mem::align_of::<$ty>(),
                fields: vec![$({
                    let uninit = ::core::mem::MaybeUninit::<$ty>::uninit();
                    let base = uninit.as_ptr();
                    // SAFETY: `addr_of!` only computes the address of a field inside `uninit`;
                    // nothing is read, so the uninitialised contents do not matter.
                    let (leaf, top) = unsafe {
                        (
                            ::core::ptr::addr_of!((*base).$first $(.$rest)*),
                            ::core::ptr::addr_of!((*base).$first),
                        )
                    };
                    $crate::testing::layout::Field {
                        c_path: $crate::layout_table!(@c $first $(.$rest)* $(=> $c)?),
                        offset: ::core::mem::offset_of!($ty, $first $(.$rest)*),
                        size: $crate::testing::layout::size_of_pointee(leaf),
                        top: stringify!($first),
                        top_offset: ::core::mem::offset_of!($ty, $first),
                        top_size: $crate::testing::layout::size_of_pointee(top),
                        top_align: $crate::testing::layout::align_of_pointee(top),
                    }
                }),*],
            }
        ),*]
    };
    (@exhaustive partial) => { false };
    (@exhaustive) => { true };
    (@c $first:ident $(. $rest:ident)* => $c:literal) => { $c };
    (@c $first:ident $(. $rest:ident)*) => {
        concat!(stringify!($first) $(, ".", stringify!($rest))*)
    };
}

/// `vec![("NAME", NAME as i64), ...]` for [`check_against_headers`]. The C side prints each
/// value cast to `long long`, so unsigned 64-bit values compare by their bit pattern.
#[macro_export]
macro_rules! layout_constants {
    ($($name:ident),* $(,)?) => {
        vec![$((stringify!($name), $name as i64)),*]
    };
}

/// Checks, independently of the headers, that the listed top-level fields of each exhaustive
/// struct tile it with only alignment padding, and that each union is as big as its biggest
/// listed member: a field missing from the table fails here.
pub fn check_tiling(types: &[Type]) {
    for t in types.iter().filter(|t| t.exhaustive) {
        let mut tops: Vec<(usize, usize, usize, &str)> = t
            .fields
            .iter()
            .map(|f| (f.top_offset, f.top_size, f.top_align, f.top))
            .collect();
        tops.sort();
        tops.dedup();
        if t.is_union {
            assert!(tops.iter().all(|&(o, ..)| o == 0), "{}", t.c_name);
            let biggest = tops.iter().map(|&(_, s, ..)| s).max().unwrap_or(0);
            assert_eq!(t.size, biggest.next_multiple_of(t.align), "{}", t.c_name);
            continue;
        }
        let mut end: usize = 0;
        for &(offset, size, align, name) in &tops {
            assert_eq!(
                offset,
                end.next_multiple_of(align),
                "{}: field before `{name}` missing from the table",
                t.c_name
            );
            end = offset + size;
        }
        assert_eq!(
            t.size,
            end.next_multiple_of(t.align),
            "{}: trailing field missing from the table",
            t.c_name
        );
    }
}

/// The C program: one line per type (`T|c_name||size|align`), per field
/// (`F|c_name|path|offset|size`) and per constant (`K|NAME||value|0`).
fn c_program(includes: &[&str], types: &[Type], constants: &[(&str, i64)]) -> String {
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n");
    for inc in includes {
        writeln!(c, "#include <{inc}>").unwrap();
    }
    c.push_str(
        "#define T(t) printf(\"T|%s||%zu|%zu\\n\", #t, sizeof(t), _Alignof(t))\n\
         #define F(t, f, s) printf(\"F|%s|%s|%zu|%zu\\n\", #t, s, offsetof(t, f), sizeof(((t *)0)->f))\n\
         int main(void) {\n",
    );
    for t in types {
        writeln!(c, "  T({});", t.c_name).unwrap();
        for f in &t.fields {
            writeln!(c, "  F({}, {}, \"{}\");", t.c_name, f.c_path, f.c_path).unwrap();
        }
    }
    for (name, _) in constants {
        writeln!(c, "  printf(\"K|{name}||%lld|0\\n\", (long long)({name}));").unwrap();
    }
    c.push_str("  return 0;\n}\n");
    c
}

/// Compiles a program printing every type, field and constant of the table from the headers
/// `includes` (the first of which must exist, else the check skips loudly naming `package`)
/// in `scratch`, runs it, and asserts the Rust side matches. Returns false when it skipped.
pub fn check_against_headers(
    includes: &[&str],
    package: &str,
    types: &[Type],
    constants: &[(&str, i64)],
    scratch: &Path,
) -> bool {
    let first = Path::new("/usr/include").join(includes[0]);
    if !first.exists() {
        skip(&format!(
            "{} not found (apt-get install {package})",
            first.display()
        ));
        return false;
    }
    if !tools_present(&["cc"]) {
        return false;
    }
    std::fs::create_dir_all(scratch).expect("create scratch dir");
    let src = scratch.join("layout.c");
    let exe = scratch.join("layout");
    std::fs::write(&src, c_program(includes, types, constants)).expect("write layout.c");
    run(Command::new("cc")
        .arg("-std=gnu11")
        .arg("-o")
        .arg(&exe)
        .arg(&src));
    let out = run(&mut Command::new(&exe));

    let mut rust: BTreeMap<(String, String), (i64, i64)> = BTreeMap::new();
    for t in types {
        rust.insert(
            (t.c_name.to_string(), String::new()),
            (t.size as i64, t.align as i64),
        );
        for f in &t.fields {
            rust.insert(
                (t.c_name.to_string(), f.c_path.to_string()),
                (f.offset as i64, f.size as i64),
            );
        }
    }
    for &(name, v) in constants {
        rust.insert((name.to_string(), String::new()), (v, 0));
    }
    let mut c = BTreeMap::new();
    for line in out.lines() {
        let parts: Vec<&str> = line.split('|').collect();
        let [kind, ty, path, a, b] = parts[..] else {
            panic!("bad line {line:?}");
        };
        let parse = |s: &str| s.parse::<i64>().unwrap_or_else(|_| panic!("{line:?}"));
        c.insert(
            (ty.to_string(), path.to_string()),
            (kind.to_string(), parse(a), parse(b)),
        );
    }
    assert_eq!(c.len(), rust.len(), "every table entry printed once");
    let mut bad = String::new();
    for (key, r) in &rust {
        let (kind, a, b) = c.get(key).expect("printed by the C program");
        if (*a, *b) != *r {
            let what = match kind.as_str() {
                "K" => "value",
                "T" => "(size, align)",
                _ => "(offset, size)",
            };
            writeln!(
                bad,
                "{} {}: C {what} = {:?}, Rust = {r:?}",
                key.0,
                key.1,
                (a, b)
            )
            .unwrap();
        }
    }
    assert!(bad.is_empty(), "layout mismatches:\n{bad}");
    eprintln!(
        "checked {} types, {} fields and {} constants against {}",
        types.len(),
        rust.len() - types.len() - constants.len(),
        constants.len(),
        includes.join(", ")
    );
    true
}
