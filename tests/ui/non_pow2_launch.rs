use tessera::prelude::*;

#[kernel]
fn k<const BLOCK: usize>(out: &mut Global<i32>) {
    let offs = program_id(0) * BLOCK + arange::<BLOCK>();
    out.store_unmasked(offs, offs);
}

fn main() -> Result<(), Error> {
    let dev = Device::best()?;
    let mut out = dev.alloc::<i32>(96)?;
    k::<48>::launch(&dev, 2u32, (&mut out,))?;
    Ok(())
}
