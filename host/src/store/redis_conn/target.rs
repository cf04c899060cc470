//! What the configured Redis value names ([`Target`]): one node, a master behind Sentinel
//! ([`SentinelUrl`]), or a cluster by its seed nodes. Parsed here once, so every way a URL
//! comes in (the config, `--redis`, `SLUICE_REDIS_URL`) means the same.

/// Which Redis deployment the configured value names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One server, which may turn out to be a cluster node when asked.
    Node(String),
    /// A master watched by sentinels.
    Sentinel(SentinelUrl),
    /// A cluster, by some of its nodes (any of them will do to find the rest).
    Cluster(Vec<String>),
}

impl Target {
    /// What `configured` names: URLs separated by whitespace (how the configuration carries a
    /// `redis = [..]` list) are a cluster's seed nodes.
    pub fn parse(configured: &str) -> Self {
        let urls: Vec<&str> = configured.split_whitespace().collect();
        match urls.as_slice() {
            [one] => SentinelUrl::parse(one)
                .map_or_else(|| Self::Node((*one).to_owned()), Self::Sentinel),
            [] => Self::Node(configured.to_owned()),
            many => Self::Cluster(many.iter().map(|u| (*u).to_owned()).collect()),
        }
    }
}

/// Where the sentinels are and which master they watch, from a
/// `redis+sentinel://host:port[,host:port...]/master-name` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The sentinels' addresses.
    pub sentinels: Vec<String>,
    /// The name the sentinels know the master by.
    pub master: String,
}

impl SentinelUrl {
    /// The URL's parts, or `None` when it is not a `redis+sentinel://` URL.
    pub fn parse(url: &str) -> Option<Self> {
        let rest = url.strip_prefix("redis+sentinel://")?;
        let (hosts, master) = rest.split_once('/')?;
        let sentinels: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{h}"))
            .collect();
        let master = master.trim_end_matches('/').to_owned();
        (!sentinels.is_empty() && !master.is_empty()).then_some(Self { sentinels, master })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis_conn::redact;

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() {
        let url =
            SentinelUrl::parse("redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster").unwrap();
        assert_eq!(
            url.sentinels,
            ["redis://10.0.0.1:26379", "redis://10.0.0.2:26380"]
        );
        assert_eq!(url.master, "mymaster");
        assert_eq!(SentinelUrl::parse("redis://10.0.0.1:6379"), None);
        assert_eq!(SentinelUrl::parse("redis+sentinel://10.0.0.1:26379/"), None);
    }

    #[test]
    fn targets_are_a_node_a_sentinel_set_or_cluster_seeds() {
        assert_eq!(
            Target::parse("redis://h:1"),
            Target::Node("redis://h:1".into())
        );
        assert!(matches!(
            Target::parse("redis+sentinel://h:1/m"),
            Target::Sentinel(_)
        ));
        assert_eq!(
            Target::parse("redis://a:1 redis://b:2"),
            Target::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        assert_eq!(
            redact("redis://:pw@a:1 redis://:pw@b:2"),
            "redis://***@a:1 redis://***@b:2"
        );
    }
}
