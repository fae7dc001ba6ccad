//! The peers the cases run beside weightbay: raw `object_store` uploads, boto3's transfer
//! manager, burn-pack, the safetensors crate, and `dd` for the disk's own limit.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use weightbay::{Error, Result};

use crate::harness::{Data, io, sync_dir, touch};

/// The peer for uploads: raw object_store `WriteMultipart` with our part size and parts in
/// flight.
pub(crate) struct RawUpload<'a> {
    pub(crate) runtime: &'a tokio::runtime::Runtime,
    pub(crate) part: usize,
    pub(crate) in_flight: usize,
}

impl RawUpload<'_> {
    pub(crate) fn upload(
        &self,
        store: &Arc<dyn object_store::ObjectStore>,
        location: &object_store::path::Path,
        bytes: &[u8],
    ) -> Result<()> {
        self.runtime
            .block_on(async {
                use object_store::ObjectStoreExt;
                let upload = store.put_multipart(location).await?;
                let mut write =
                    object_store::WriteMultipart::new_with_chunk_size(upload, self.part);
                for chunk in bytes.chunks(8 << 20) {
                    write.wait_for_capacity(self.in_flight).await?;
                    write.write(chunk);
                }
                write.finish().await.map(drop)
            })
            .map_err(|e| Error::new(weightbay::ErrorKind::Io, e.to_string()))
    }
}

/// Runs `dd` with `operands` (and `status=none`), the machine's own limit for a case.
pub(crate) fn dd(operands: &[&str]) -> Result<()> {
    let status = std::process::Command::new("dd")
        .args(operands)
        .arg("status=none")
        .status()
        .map_err(io("running dd"))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::invalid(format!("dd {} failed", operands.join(" "))))
    }
}

/// burn-pack's atomic, durable save of the same data (buffers copied in before timing
/// would be fairer, but burn's `Bytes` takes ownership; the copy is a memcpy).
pub(crate) fn burn_pack_save(data: &Data, path: &Path) -> Result<()> {
    let tensors = data
        .tensors
        .iter()
        .map(|(name, bytes)| {
            burn_pack::Tensor::new(
                name.clone(),
                burn_pack::DType::F32,
                vec![bytes.len() / 4],
                None,
                burn_pack::Bytes::from_shared(bytes.clone(), burn_std::AllocationProperty::Native),
            )
        })
        .collect();
    burn_pack::Writer::new(tensors)
        .write_to_file(path)
        .map_err(|e| Error::invalid(e.to_string()))
}

/// safetensors' `serialize_to_file`, then the fsyncs it leaves to its caller.
pub(crate) fn safetensors_save(data: &Data, path: &Path) -> Result<()> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
        .tensors
        .iter()
        .map(|(name, bytes)| {
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                vec![bytes.len() / 4],
                bytes,
            )
            .map_err(|e| Error::invalid(e.to_string()))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<_>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| Error::invalid(e.to_string()))?;
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io("syncing"))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// memmap2 + `SafeTensors::deserialize` + touch every tensor.
pub(crate) fn safetensors_mmap_touch(path: &Path) -> Result<()> {
    let file = std::fs::File::open(path).map_err(io("opening"))?;
    // SAFETY: the benchmark's own file, not modified while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io("mapping"))?;
    let tensors =
        safetensors::SafeTensors::deserialize(&map).map_err(|e| Error::invalid(e.to_string()))?;
    let mut sum = 0;
    for (_, view) in tensors.tensors() {
        sum += touch(view.data());
    }
    std::hint::black_box(sum);
    Ok(())
}

/// boto3's transfer manager (what the AWS CLI's `aws s3 cp` runs, default settings: 8 MiB
/// parts, 10 threads) moving `key` of the S3 server's bucket to or from `path`, timed inside
/// Python so its start-up is not counted. The Python is `$WEIGHTBAY_PYTHON`, or the venv
/// `scripts/servers.sh` installs moto into (boto3 comes with moto). `None` when it has no boto3.
pub(crate) fn boto3_transfer(upload: bool, key: &str, path: &Path) -> Result<Option<Duration>> {
    const SCRIPT: &str = r#"
import sys, time
import boto3
op, bucket, key, path, endpoint = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=endpoint)
start = time.monotonic()
if op == "upload":
    s3.upload_file(path, bucket, key)
else:
    s3.download_file(bucket, key, path)
print(time.monotonic() - start)
"#;
    let python = std::env::var("WEIGHTBAY_PYTHON").unwrap_or_else(|_| {
        let home = std::env::var("HOME").unwrap_or_default();
        format!("{home}/.cache/weightbay/venv/bin/python")
    });
    let has_boto3 = std::process::Command::new(&python)
        .args(["-c", "import boto3"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !has_boto3 {
        return Ok(None);
    }
    let (Ok(bucket), Ok(endpoint)) = (std::env::var("AWS_BUCKET"), std::env::var("AWS_ENDPOINT"))
    else {
        return Ok(None);
    };
    let output = std::process::Command::new(&python)
        .args(["-c", SCRIPT])
        .args([if upload { "upload" } else { "download" }, &bucket, key])
        .arg(path)
        .arg(&endpoint)
        .output()
        .map_err(io("running boto3"))?;
    if !output.status.success() {
        return Err(Error::new(
            weightbay::ErrorKind::Io,
            format!("boto3 failed: {}", String::from_utf8_lossy(&output.stderr)),
        ));
    }
    let seconds: f64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|_| Error::invalid("boto3's timing printed no number"))?;
    Ok(Some(Duration::from_secs_f64(seconds)))
}
