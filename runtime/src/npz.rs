//! `.npz` reading and writing: a zip archive of `.npy` files, one per
//! array, named `NAME.npy` — what `numpy.savez` and `numpy.savez_compressed`
//! write and `numpy.load` reads. Written uncompressed, as `numpy.savez` does;
//! read stored or deflated.

use crate::npy::{read_npy_bytes, write_npy_to, NpyError};
use crate::Tensor;
use std::io::Read;
use std::path::Path;

/// Read every array of an `.npz` file, in archive order, as `(name, tensor)`.
/// The arrays' data together may take at most `max_bytes`; what an entry
/// claims is checked before it is inflated, and what it inflates to too, so
/// a lying or highly compressed archive cannot exhaust memory.
pub fn read_npz_limited(path: &Path, max_bytes: u64) -> Result<Vec<(String, Tensor)>, NpyError> {
    let shown = path.display().to_string();
    let bad = |reason: String| NpyError::NpzMalformed { path: shown.clone(), reason };
    let file = std::fs::File::open(path).map_err(|source| NpyError::Open { path: shown.clone(), source })?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| bad(e.to_string()))?;
    let mut left = max_bytes;
    let mut out: Vec<(String, Tensor)> = Vec::new();
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| bad(e.to_string()))?;
        if entry.is_dir() {
            continue;
        }
        let file_name = entry.name().to_string();
        let Some(name) = file_name.strip_suffix(".npy") else {
            return Err(bad(format!("entry `{file_name}` is not an .npy file")));
        };
        if out.iter().any(|(n, _)| n == name) {
            return Err(bad(format!("it holds `{name}` twice")));
        }
        let too_big =
            || bad(format!("its arrays exceed the memory available to this run ({})", crate::memory::human(max_bytes)));
        if entry.size() > left {
            return Err(too_big());
        }
        let mut bytes = Vec::new();
        (&mut entry)
            .take(left.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| bad(format!("`{file_name}`: {e}")))?;
        if bytes.len() as u64 > left {
            return Err(too_big());
        }
        left -= bytes.len() as u64;
        let t = read_npy_bytes(&bytes, &format!("{shown}:{file_name}"))?;
        out.push((name.to_string(), t));
    }
    Ok(out)
}

/// Write arrays as an `.npz` file (entries `NAME.npy`, stored), atomically.
pub fn write_npz(path: &Path, arrays: &[(&str, &Tensor)]) -> Result<(), NpyError> {
    let shown = path.display().to_string();
    let err = |source: std::io::Error| NpyError::Write { path: shown.clone(), source };
    crate::atomic::write_with(path, |file| {
        let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(file));
        // A fixed time stamp keeps the file identical from run to run.
        let options = zip::write::FileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .last_modified_time(zip::DateTime::default())
            .large_file(arrays.iter().any(|(_, t)| t.len() as u64 * t.dtype().size() as u64 >= u32::MAX as u64));
        let io = |e: zip::result::ZipError| std::io::Error::other(e.to_string());
        for (name, t) in arrays {
            zip.start_file(format!("{name}.npy"), options).map_err(io)?;
            write_npy_to(&mut zip, t)?;
        }
        let mut w = zip.finish().map_err(io)?;
        std::io::Write::flush(&mut w)
    })
    .map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn arrays_round_trip_in_order() {
        let dir = std::env::temp_dir().join(format!("texc-npz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("two.npz");
        let a = Tensor::from_f64(DType::F32, vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.5]);
        let b = Tensor::from_f64(DType::I64, vec![4], &[-1.0, 0.0, 7.0, 9.0]);
        write_npz(&path, &[("Y", &a), ("idx", &b)]).expect("write");
        let back = read_npz_limited(&path, u64::MAX).expect("read");
        assert_eq!(back.len(), 2);
        assert_eq!((back[0].0.as_str(), back[1].0.as_str()), ("Y", "idx"));
        assert_eq!(back[0].1.shape, vec![2, 3]);
        assert_eq!(back[0].1.to_f64(), a.to_f64());
        assert_eq!(back[1].1.dtype(), DType::I64);
        assert_eq!(back[1].1.to_f64(), b.to_f64());
        // Deterministic bytes.
        let again = dir.join("again.npz");
        write_npz(&again, &[("Y", &a), ("idx", &b)]).expect("write");
        assert_eq!(std::fs::read(&path).expect("r"), std::fs::read(&again).expect("r"));
        // A budget smaller than the data is refused before it is read.
        let e = read_npz_limited(&path, 16).expect_err("over budget");
        assert!(e.to_string().contains("exceed the memory available"), "{e}");
        let junk = dir.join("junk.npz");
        std::fs::write(&junk, b"PK not really").expect("w");
        let e = read_npz_limited(&junk, u64::MAX).expect_err("junk");
        assert!(e.to_string().contains("is not a valid .npz archive"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
