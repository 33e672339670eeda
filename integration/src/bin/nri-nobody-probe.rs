//! Tries, as the user it runs as (a test starts it as `nobody`), to read,
//! list and connect to the paths of a JSON [`integration::probe::ProbeRequest`]
//! on stdin, and prints the [`integration::probe::ProbeReport`] as JSON.

fn main() -> anyhow::Result<()> {
    let req: integration::probe::ProbeRequest = serde_json::from_reader(std::io::stdin())?;
    println!("{}", serde_json::to_string(&integration::probe::probe(&req))?);
    Ok(())
}
