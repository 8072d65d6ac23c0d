//! `corral cp`: streams a file into or out of a sandbox.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use reqwest::blocking::Body;
use reqwest::Method;

use super::http::{segment, Api, Conn};

#[derive(Args, Debug)]
#[command(after_help = "One side is ID:/path inside a sandbox, the other a local path or - for stdin/stdout.\n\n\
                        Examples:\n  corral cp ./main.py 3k9x2m7q8w1e5r4t6y0u:/home/user/main.py\n  \
                        corral cp ID:/home/user/out.csv ./out.csv\n  \
                        tar c src | corral cp - ID:/tmp/src.tar")]
pub struct CpArgs {
    /// Source: a local path, -, or ID:/path
    #[arg(value_name = "SRC")]
    src: String,
    /// Destination: a local path, -, or ID:/path
    #[arg(value_name = "DST")]
    dst: String,
    #[command(flatten)]
    conn: Conn,
}

/// `ID:/abs/path` → (id, path). Anything else is local (so `./a:b` stays local).
fn remote(spec: &str) -> Option<(&str, &str)> {
    let (id, path) = spec.split_once(':')?;
    let is_id = !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    (is_id && path.starts_with('/')).then_some((id, path))
}

fn file_name(path: &str) -> Option<&str> {
    path.trim_end_matches('/').rsplit('/').next().filter(|n| !n.is_empty() && *n != "." && *n != "..")
}

pub fn run(args: CpArgs) -> Result<i32> {
    let api = Api::new(&args.conn)?;
    match (remote(&args.src), remote(&args.dst)) {
        (None, Some((id, path))) => upload(&api, &args.src, id, path),
        (Some((id, path)), None) => download(&api, id, path, &args.dst),
        (Some(_), Some(_)) => bail!("copying between two sandboxes is not supported; copy through a local file"),
        (None, None) => bail!("one of SRC and DST must be ID:/path inside a sandbox"),
    }
}

fn upload(api: &Api, local: &str, id: &str, remote_path: &str) -> Result<i32> {
    let mut target = remote_path.to_string();
    let mut query = Vec::new();
    let body = if local == "-" {
        Body::new(std::io::stdin())
    } else {
        let file = File::open(local).with_context(|| format!("opening {local}"))?;
        let meta = file.metadata().with_context(|| format!("reading {local}"))?;
        if meta.is_dir() {
            bail!("{local} is a directory; only files can be copied");
        }
        if target.ends_with('/') {
            target.push_str(file_name(local).context("the source has no file name")?);
        }
        use std::os::unix::fs::PermissionsExt;
        query.push(("mode", format!("{:o}", meta.permissions().mode() & 0o777)));
        // From a File, the body has a known length and is still read chunk by chunk.
        Body::from(file)
    };
    query.push(("path", target));
    api.send(api.request(Method::PUT, &format!("/v1/sandboxes/{}/files", segment(id))).query(&query).body(body))?;
    Ok(0)
}

fn download(api: &Api, id: &str, remote_path: &str, local: &str) -> Result<i32> {
    let request = api.request(Method::GET, &format!("/v1/sandboxes/{}/files", segment(id))).query(&[("path", remote_path)]);
    let mut response = api.send(request)?;
    if local == "-" {
        let mut out = std::io::stdout().lock();
        response.copy_to(&mut out).context("downloading")?;
        out.flush()?;
        return Ok(0);
    }
    let mut target = PathBuf::from(local);
    if target.is_dir() {
        target.push(file_name(remote_path).context("the source has no file name")?);
    }
    let mut file = File::create(&target).with_context(|| format!("creating {}", target.display()))?;
    if let Err(err) = response.copy_to(&mut file) {
        // Do not leave a truncated file that looks complete.
        let _ = std::fs::remove_file(&target);
        return Err(err).context("downloading");
    }
    file.sync_all().with_context(|| format!("writing {}", Path::new(&target).display()))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_specs_need_an_id_and_an_absolute_path() {
        assert_eq!(remote("abc123:/home/user/x"), Some(("abc123", "/home/user/x")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("abc:relative"), None);
        assert_eq!(remote("/tmp/file"), None);
        assert_eq!(file_name("/a/b/"), Some("b"));
    }
}
