//! Writes the seed inputs of every fuzz target into `fuzz/corpus/<target>/`
//! (`seed-N` files; existing files are kept).

fn main() -> std::io::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, seeds) in rocketgate_fuzz::seeds::all() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (i, seed) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed)?;
        }
        println!("{target}: {} seeds", seeds.len());
    }
    Ok(())
}
