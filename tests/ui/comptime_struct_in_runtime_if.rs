use tessera::prelude::*;

#[derive(Clone, Debug)]
struct Stats {
    count: i32,
}

// A field of a comptime struct changed inside an `if` (comptime or runtime): the
// struct would have to be carried, and only tiles and Rust numbers can be.
#[kernel]
fn k(out: &mut Global<i32>, flag: i32) {
    let mut s = Stats { count: 0 };
    if flag.eq(1) {
        s.count += 1;
    }
    out.store_unmasked(arange::<16>(), arange::<16>() + s.count);
}

fn main() {}
