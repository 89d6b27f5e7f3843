use tessera::prelude::*;

#[kernel]
fn k(data: &mut Symmetric<f32>) {
    let offs = arange::<64>();
    data.put(1, offs, data.load_unmasked(offs), offs.lt(64));
}

fn main() -> Result<(), Error> {
    let dev = Device::best()?;
    // A plain device buffer has no copy on the peers: it cannot stand for a
    // `&mut Symmetric<f32>` parameter.
    let mut data = dev.alloc::<f32>(64)?;
    k::launch(&dev, 1u32, (&mut data,))?;
    Ok(())
}
