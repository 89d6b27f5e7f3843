use tessera::prelude::*;

// Macro arguments run as plain Rust while the kernel is built: control flow or an
// assignment hidden there would escape the rewrite of the kernel's control flow.
#[kernel]
fn k(out: &mut Global<i32>, #[comptime] n: Option<i32>) {
    let offs = arange::<16>();
    let mut count = 0;
    println!("{}", {
        return;
        1
    });
    assert!(match n {
        Some(_) => true,
        None => false,
    });
    assert_eq!(n?, 1);
    println!("{}", loop {});
    for i in 0..4 {
        assert!(i < 10 || { continue });
        assert!(i < 10 || { break });
    }
    println!("{:?}", {
        count = 3;
        count
    });
    println!("{:?}", {
        count += 1;
        count
    });
    println!("{}", {
        while count < 0 {}
        1
    });
    println!("{}", {
        for _j in 0..3 {}
        1
    });
    println!("{}", format!("{}", todo!()));
    // `name = value` is a named format argument only after a format-style macro's format
    // string: elsewhere it is an assignment.
    let _v = vec![count = 1];
    assert_eq!(count = 1, ());
    assert!(matches!(count = 1, _));
    println!("{}", (count = 2, 1).1);
    // Still allowed: comparisons, named format arguments, `if`, `let`, `matches!` guards.
    println!("{}", {
        let s = count + 1;
        s
    });
    assert!(count <= 3 && count >= 0 && count != 7 && count == count);
    println!("{x} {}", if count > 1 { 1 } else { 2 }, x = count);
    assert!(count >= 0, "{}", format!("{v}", v = count));
    assert_eq!(count, count, "{a} {b}", a = count, b = format!("{c}", c = 1));
    assert!(matches!(n, Some(v) if v > 0) || n.is_none());
    out.store_unmasked(offs, offs);
}

fn main() {}
