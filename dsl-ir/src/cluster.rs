//! Thread-block clusters: the launch rule every device checks, and the geometry of a
//! cluster's ranks that the code generator and the emulator share.
//!
//! A launch in clusters of `cx * cy * cz` programs groups the programs whose grid
//! coordinates differ only within the cluster's box. A program's *rank* in its
//! cluster is `x + cx * (y + cy * z)` for its place `(x, y, z)` in the box (PTX's
//! `%cluster_ctarank`); ranks are bits of a CTA mask.

/// The most programs a cluster may have (the portable limit of sm_90 and sm_100).
pub const MAX_CLUSTER_SIZE: u32 = 8;

/// Checks a cluster shape for a grid: every extent at least 1, at most
/// [`MAX_CLUSTER_SIZE`] programs, and each grid extent a multiple of the
/// cluster's. The message says what is wrong.
pub fn check(cluster: [u32; 3], grid: [u32; 3]) -> Result<(), String> {
    let size: u64 = cluster.iter().map(|&c| c as u64).product();
    if cluster.contains(&0) || size > MAX_CLUSTER_SIZE as u64 {
        return Err(format!(
            "a cluster of {}x{}x{} programs: each extent must be at least 1 and the cluster at most {MAX_CLUSTER_SIZE} programs",
            cluster[0], cluster[1], cluster[2]
        ));
    }
    for (a, (&g, &c)) in grid.iter().zip(&cluster).enumerate() {
        if g % c != 0 {
            return Err(format!(
                "the grid's axis {a} has {g} programs, not a multiple of the cluster's {c}"
            ));
        }
    }
    Ok(())
}

/// The place `(x, y, z)` in the cluster's box of rank `rank`.
pub fn place(cluster: [u32; 3], rank: u32) -> [u32; 3] {
    [
        rank % cluster[0],
        (rank / cluster[0]) % cluster[1],
        rank / (cluster[0] * cluster[1]),
    ]
}

/// The ranks (a bit each) whose place differs from rank `rank`'s only along the
/// axes `axes` (a bit per axis): the programs of its cluster row along them.
pub fn group(cluster: [u32; 3], axes: u8, rank: u32) -> u32 {
    let me = place(cluster, rank);
    (0..cluster.iter().product::<u32>())
        .filter(|&q| {
            let p = place(cluster, q);
            (0..3).all(|a| axes >> a & 1 == 1 || p[a] == me[a])
        })
        .fold(0, |m, q| m | 1 << q)
}

/// The union of the groups ([`group`]) of rank `rank` along each of `axes`, itself
/// included.
pub fn groups(cluster: [u32; 3], axes: &[u8], rank: u32) -> u32 {
    axes.iter()
        .fold(1 << rank, |m, &a| m | group(cluster, a, rank))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_the_cluster_rows_along_the_axes() {
        // 2 x 2: rank = x + 2y.
        assert_eq!(group([2, 2, 1], 0b01, 0), 0b0011);
        assert_eq!(group([2, 2, 1], 0b01, 3), 0b1100);
        assert_eq!(group([2, 2, 1], 0b10, 1), 0b1010);
        assert_eq!(group([2, 2, 1], 0b11, 2), 0b1111);
        assert_eq!(group([4, 1, 1], 0b01, 2), 0b1111);
        assert_eq!(group([1, 2, 2], 0b100, 1), 0b1010);
        assert_eq!(group([2, 1, 1], 0, 1), 0b10);
        // A and B multicast along different axes of a 2 x 2 cluster: a row and a
        // column, 3 ranks.
        assert_eq!(groups([2, 2, 1], &[0b10, 0b01], 0), 0b0111);
        assert_eq!(place([2, 2, 2], 6), [0, 1, 1]);
    }

    #[test]
    fn shapes_and_grids_are_checked() {
        assert!(check([2, 2, 2], [4, 2, 2]).is_ok());
        assert!(
            check([4, 4, 1], [4, 4, 1])
                .unwrap_err()
                .contains("at most 8")
        );
        assert!(check([0, 1, 1], [4, 1, 1]).is_err());
        assert!(
            check([2, 1, 1], [3, 1, 1])
                .unwrap_err()
                .contains("not a multiple of the cluster's 2")
        );
    }
}
