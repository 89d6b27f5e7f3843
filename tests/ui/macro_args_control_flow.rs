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
    // Still allowed: comparisons, named format arguments, `if`, `let`, `matches!` guards.
    println!("{}", {
        let s = count + 1;
        s
    });
    assert!(count <= 3 && count >= 0 && count != 7 && count == count);
    println!("{x} {}", if count > 1 { 1 } else { 2 }, x = count);
    assert!(matches!(n, Some(v) if v > 0) || n.is_none());
    out.store_unmasked(offs, offs);
}

fn main() {}
