use tessera::prelude::*;

#[kernel]
fn k(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = arange::<64>();
    out.store_unmasked(offs, x.load_unmasked(offs));
}

fn main() -> Result<(), Error> {
    let dev = Device::best()?;
    let x = dev.upload(&vec![f16::ONE; 64])?;
    let mut out = dev.alloc::<f32>(64)?;
    k::launch(&dev, 1u32, (&x, &mut out))?;
    Ok(())
}
