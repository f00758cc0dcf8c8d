//! The S3 door's flags of `locus serve` and its start (the door itself is `locus-s3`).

use clap::Args;
use locus_server::{config, ServerConfig, Shared};
use std::sync::Arc;

/// `locus serve`'s S3 flags.
#[derive(Args, Debug, Clone)]
pub struct S3Args {
    /// Also speak S3 on this port (same address as --listen; 0 picks one), HTTPS under
    /// --tls. Buckets are the export's top-level directories; the access key is a
    /// subject's name and its secret what `locus token SUBJECT --s3` prints.
    #[arg(long, value_name = "PORT")]
    pub s3_port: Option<u16>,
    /// The subject unsigned S3 requests act as (by default they are refused). Grant it
    /// what anonymous readers may do with `locus acl set`.
    #[arg(long, value_name = "SUBJECT", requires = "s3_port")]
    pub s3_anonymous: Option<String>,
    /// A domain for virtual-host-style S3 requests (BUCKET.DOMAIN); repeatable. Path
    /// style (DOMAIN/BUCKET/KEY) always works.
    #[arg(long, value_name = "DOMAIN", requires = "s3_port")]
    pub s3_domain: Vec<String>,
    /// Hours after which a multipart upload that receives no part is removed with its parts.
    #[arg(long, value_name = "HOURS", default_value_t = 24.0, requires = "s3_port")]
    pub s3_upload_max_age_h: f64,
}

/// Binds the S3 door next to the native port and serves it; answers the port it took.
pub async fn start(
    args: &S3Args,
    port: u16,
    ip: std::net::IpAddr,
    config: &ServerConfig,
    shared: &Arc<Shared>,
) -> Result<u16, String> {
    if !(args.s3_upload_max_age_h.is_finite() && args.s3_upload_max_age_h > 0.0 && args.s3_upload_max_age_h <= 87_600.0)
    {
        return Err("--s3-upload-max-age-h must be a positive number of hours, at most ten years".into());
    }
    let at = std::net::SocketAddr::new(ip, port);
    let listener = tokio::net::TcpListener::bind(at).await.map_err(|e| format!("S3 on {at}: {e}"))?;
    let at = listener.local_addr().map_err(|e| e.to_string())?;
    let scheme = if config.tls { "https" } else { "http" };
    eprintln!("  S3: {scheme}://{at}/ (keys: locus token SUBJECT --s3)");
    let s3 = locus_s3::S3Config {
        anonymous: args.s3_anonymous.clone(),
        domains: args.s3_domain.clone(),
        upload_max_age: std::time::Duration::from_secs_f64(args.s3_upload_max_age_h * 3600.0),
        state_dir: config.state_dir.clone(),
    };
    let tls = match config.tls {
        true => Some(config::tls_acceptor(&config.state_dir).map_err(|e| e.to_string())?),
        false => None,
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        if let Err(e) = locus_s3::serve(listener, shared, s3, tls).await {
            eprintln!("locus: the S3 door stopped: {e}");
            std::process::exit(1);
        }
    });
    Ok(at.port())
}

/// Prints a subject's S3 keys in the form `aws configure` and the AWS variables take.
pub fn print_keys(subject: &str, token: &[u8]) {
    println!("AWS_ACCESS_KEY_ID={subject}");
    println!("AWS_SECRET_ACCESS_KEY={}", locus_s3::keys::secret_of(token));
}
