//! Where the locks live: the connection options, from flags or the environment, and the
//! manager they describe, with a URL's topology found by asking its server.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use distlock_runtime::{LockManager, LockManagerBuilder, ServerKind};

use crate::Failure;

/// The connection options. Each can come from the environment instead (shown in `--help`);
/// a flag beats its variable.
#[derive(Args)]
pub(crate) struct Connection {
    /// One Redis: `redis://[user:password@]host[:port][/db]` (or `rediss://`). A cluster node
    /// or a Sentinel given here is found out and used as one. REDIS_URL is read only when no
    /// topology is given otherwise (flag or DISTLOCK_ variable).
    #[arg(long, global = true, env = "REDIS_URL", hide_env_values = true)]
    url: Option<String>,
    /// A Redis Cluster: a seed node's URL (repeat for more seeds; comma-separated in the
    /// variable).
    #[arg(
        long = "cluster",
        global = true,
        env = "DISTLOCK_CLUSTER",
        value_delimiter = ',',
        hide_env_values = true
    )]
    cluster: Vec<String>,
    /// Sentinel: the name of the primary the sentinels monitor (with --sentinel-url).
    #[arg(long = "sentinel", global = true, env = "DISTLOCK_SENTINEL")]
    sentinel: Option<String>,
    /// Sentinel: a sentinel's URL (repeat for more; comma-separated in the variable).
    #[arg(
        long = "sentinel-url",
        global = true,
        env = "DISTLOCK_SENTINEL_URLS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    sentinel_urls: Vec<String>,
    /// A Redlock quorum: a node's URL (repeat for each node; comma-separated in the variable).
    #[arg(
        long = "quorum",
        global = true,
        env = "DISTLOCK_QUORUM",
        value_delimiter = ',',
        hide_env_values = true
    )]
    quorum: Vec<String>,
    /// The key prefix the services use.
    #[arg(
        long,
        global = true,
        env = "DISTLOCK_PREFIX",
        default_value = "distlock:"
    )]
    prefix: String,
    /// TLS (`rediss://` URLs): trust the CA certificates in this PEM file instead of the
    /// system's.
    #[arg(long, global = true, env = "DISTLOCK_TLS_CA", value_name = "PEM_FILE")]
    tls_ca: Option<PathBuf>,
    /// Mutual TLS: this client's certificate chain (PEM file), with --tls-key.
    #[arg(
        long,
        global = true,
        env = "DISTLOCK_TLS_CERT",
        value_name = "PEM_FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// Mutual TLS: this client's private key (PEM file), with --tls-cert.
    #[arg(
        long,
        global = true,
        env = "DISTLOCK_TLS_KEY",
        value_name = "PEM_FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// Connect and response timeout, in milliseconds.
    #[arg(
        long,
        global = true,
        env = "DISTLOCK_TIMEOUT_MS",
        default_value_t = 2000
    )]
    timeout_ms: u64,
}

/// Where the locks live, as the options say.
enum Topology {
    /// `--url` or `REDIS_URL`: its server says what it is.
    Url {
        url: String,
        from: &'static str,
    },
    Cluster(Vec<String>),
    Sentinel {
        name: String,
        urls: Vec<String>,
    },
    Quorum(Vec<String>),
}

/// The manager the options describe (`matches`: what clap parsed them from, which tells a flag
/// from a variable): exactly one topology; a URL's server asked what it is (see
/// [`LockManagerBuilder::probe`]), a line on stderr saying so when it is not one server.
pub(crate) async fn manager(
    options: &Connection,
    matches: &ArgMatches,
) -> Result<LockManager, Failure> {
    let timeout = Duration::from_millis(options.timeout_ms.max(1));
    let mut builder: LockManagerBuilder = LockManager::builder()
        .prefix(options.prefix.clone())
        .connect_timeout(timeout)
        .response_timeout(timeout)
        .pool_wait_timeout(timeout);
    if let Some(ca) = &options.tls_ca {
        builder = builder.tls_ca_pem(read(ca)?);
    }
    if let (Some(cert), Some(key)) = (&options.tls_cert, &options.tls_key) {
        builder = builder.tls_client_cert_pem(read(cert)?, read(key)?);
    }
    let builder = match options.topology(matches)? {
        Topology::Url { url, from } => found(builder, url, from).await?,
        Topology::Cluster(seeds) => builder.cluster(seeds),
        Topology::Sentinel { name, urls } => builder.sentinel(name, urls),
        Topology::Quorum(nodes) => builder.quorum(nodes),
    };
    builder.build().map_err(usage)
}

impl Connection {
    /// The one topology the options give: those given as flags; without any, those given by
    /// `DISTLOCK_` variables; without any, `REDIS_URL`.
    fn topology(&self, matches: &ArgMatches) -> Result<Topology, Failure> {
        // Each topology, with the options that give it.
        let groups: [(&[&str], bool); 4] = [
            (&["url"], self.url.is_some()),
            (&["cluster"], !self.cluster.is_empty()),
            (
                &["sentinel", "sentinel_urls"],
                self.sentinel.is_some() || !self.sentinel_urls.is_empty(),
            ),
            (&["quorum"], !self.quorum.is_empty()),
        ];
        let from = |id: &str| matches.value_source(id);
        let flagged = |ids: &[&str]| {
            ids.iter()
                .any(|id| from(id) == Some(ValueSource::CommandLine))
        };
        let chosen: Vec<usize> = if groups.iter().any(|(ids, _)| flagged(ids)) {
            (0..4).filter(|&i| flagged(groups[i].0)).collect()
        } else if groups[1..].iter().any(|(_, given)| *given) {
            (1..4).filter(|&i| groups[i].1).collect()
        } else if self.url.is_some() {
            vec![0]
        } else {
            return Err(Failure::Usage(
                "say where the locks live: pass --url URL (or --cluster, --sentinel with \
                 --sentinel-url, or --quorum), or set REDIS_URL"
                    .to_owned(),
            ));
        };
        if chosen.len() != 1 {
            return Err(Failure::Usage(
                "say where the locks live with exactly one of --url, --cluster, --sentinel \
                 (with --sentinel-url) or --quorum (flags beat DISTLOCK_ variables, which beat \
                 REDIS_URL)"
                    .to_owned(),
            ));
        }
        Ok(match chosen[0] {
            0 => Topology::Url {
                url: self.url.clone().unwrap_or_default(),
                from: if from("url") == Some(ValueSource::CommandLine) {
                    "--url"
                } else {
                    "REDIS_URL"
                },
            },
            1 => Topology::Cluster(self.cluster.clone()),
            2 => match &self.sentinel {
                Some(name) if !self.sentinel_urls.is_empty() => Topology::Sentinel {
                    name: name.clone(),
                    urls: self.sentinel_urls.clone(),
                },
                Some(_) => {
                    return Err(Failure::Usage(
                        "--sentinel NAME needs at least one --sentinel-url".to_owned(),
                    ))
                }
                None => {
                    return Err(Failure::Usage(
                        "--sentinel-url needs --sentinel NAME, the primary's name".to_owned(),
                    ))
                }
            },
            _ => Topology::Quorum(self.quorum.clone()),
        })
    }
}

/// `builder` for the server at `url` (given as `from`), as it says it is: one server, a
/// cluster node (a seed of its cluster), or a Sentinel that monitors exactly one primary.
async fn found(
    builder: LockManagerBuilder,
    url: String,
    from: &str,
) -> Result<LockManagerBuilder, Failure> {
    Ok(match builder.probe(&url).await? {
        ServerKind::ClusterNode => {
            eprintln!(
                "distlock: {from} names a Redis Cluster node: using it as a seed of its cluster \
                 (as --cluster would)"
            );
            builder.cluster([url])
        }
        ServerKind::Sentinel { primaries } => match <[String; 1]>::try_from(primaries) {
            Ok([name]) => {
                eprintln!(
                    "distlock: {from} names a Sentinel: using the primary it monitors, {name} \
                     (as --sentinel {name} --sentinel-url would)"
                );
                builder.sentinel(name, [url])
            }
            Err(primaries) if primaries.is_empty() => {
                return Err(Failure::Usage(format!(
                    "{from} names a Sentinel that monitors no primary: pass the primary's \
                     sentinels with --sentinel NAME --sentinel-url URL, or the primary itself \
                     with --url"
                )))
            }
            Err(primaries) => {
                return Err(Failure::Usage(format!(
                    "{from} names a Sentinel that monitors {} primaries ({}): choose one with \
                     --sentinel NAME --sentinel-url URL",
                    primaries.len(),
                    primaries.join(", ")
                )))
            }
        },
        _ => builder.url(url),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(path).map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display())))
}

/// Settings the manager refused: bad arguments.
fn usage(error: distlock_runtime::LockError) -> Failure {
    Failure::Usage(error.to_string())
}
