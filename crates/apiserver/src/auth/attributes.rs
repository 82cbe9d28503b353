//! What a request asks to do, in the terms authorization decides on: kube-apiserver's
//! `RequestInfo` (k8s.io/apiserver/pkg/endpoints/request/requestinfo.go), derived from the
//! method, the path and the query alone, before anything is looked up.

use std::fmt;

/// A request's verb and what it addresses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Attributes {
    /// `/api/v1/…` or `/apis/GROUP/VERSION/…` with a resource.
    Resource(ResourceAttributes),
    /// Everything else (`/version`, `/api`, `/apis/GROUP/VERSION`, `/openapi/v2`, `/healthz`):
    /// the lower-case HTTP method as the verb, and the path.
    NonResource { verb: String, path: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceAttributes {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// "" for the core group.
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    /// "" for cluster-scoped requests (and for a list across every namespace).
    pub namespace: String,
    /// "" for creates and lists, unless a list selects one name (`fieldSelector=metadata.name=…`).
    pub name: String,
}

/// Where the namespace in a path is not a prefix but the object: `/api/v1/namespaces/NS/status`.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

impl Attributes {
    /// The attributes of a request for `path` with `method` and query `params` (first value
    /// wins, as the handlers read them).
    pub fn of(method: &str, path: &str, params: &[(String, String)]) -> Attributes {
        let param = |key: &str| {
            params
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let non_resource = || Attributes::NonResource {
            verb: method.to_ascii_lowercase(),
            path: path.to_string(),
        };
        let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        // /api/v1/RESOURCE at the least; shorter paths are discovery.
        if parts.len() < 3 {
            return non_resource();
        }
        let (group, rest) = match parts[0] {
            "api" => ("", &parts[1..]),
            "apis" if parts.len() >= 4 => (parts[1], &parts[2..]),
            _ => return non_resource(),
        };
        let (version, mut rest) = (rest[0], &rest[1..]);
        let mut verb = match method {
            "POST" => "create",
            "GET" | "HEAD" => "get",
            "PUT" => "update",
            "PATCH" => "patch",
            "DELETE" => "delete",
            _ => "",
        }
        .to_string();
        // The deprecated /watch/ prefix.
        if rest.first() == Some(&"watch") {
            verb = "watch".into();
            rest = &rest[1..];
        }
        let mut namespace = "";
        if rest.first() == Some(&"namespaces") && rest.len() > 1 {
            namespace = rest[1];
            if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
                rest = &rest[2..];
            }
        }
        let resource = rest.first().copied().unwrap_or_default();
        let mut name = rest.get(1).copied().unwrap_or_default().to_string();
        let subresource = rest.get(2).copied().unwrap_or_default();
        if rest.len() < 2 {
            verb = match verb.as_str() {
                "get" if matches!(param("watch"), Some("true" | "1")) => "watch".into(),
                "get" => "list".into(),
                "delete" => "deletecollection".into(),
                _ => verb,
            };
            // A list or watch of one name is authorized as that name, so that resourceNames
            // rules allow watching a single object.
            if matches!(verb.as_str(), "list" | "watch")
                && let Some(selected) = param("fieldSelector").and_then(selected_name)
            {
                name = selected.to_string();
            }
        }
        Attributes::Resource(ResourceAttributes {
            verb,
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
            subresource: subresource.to_string(),
            namespace: namespace.to_string(),
            name,
        })
    }
}

/// The name a field selector pins, if it is exactly `metadata.name=NAME` (or `==`).
fn selected_name(selector: &str) -> Option<&str> {
    let value = selector
        .strip_prefix("metadata.name==")
        .or_else(|| selector.strip_prefix("metadata.name="))?;
    (!value.is_empty() && !value.contains(',')).then_some(value)
}

impl ResourceAttributes {
    /// `resource` or `resource/subresource`, as RBAC rules and messages write it.
    pub fn resource_path(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// As kube-apiserver's audit and error messages write a request.
impl fmt::Display for Attributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attributes::NonResource { verb, path } => write!(f, "{verb} path {path:?}"),
            Attributes::Resource(r) => {
                write!(
                    f,
                    "{} resource {:?} in API group {:?}",
                    r.verb,
                    r.resource_path(),
                    r.group
                )?;
                if r.namespace.is_empty() {
                    write!(f, " at the cluster scope")
                } else {
                    write!(f, " in the namespace {:?}", r.namespace)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(method: &str, path: &str, query: &[(&str, &str)]) -> ResourceAttributes {
        let params: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match Attributes::of(method, path, &params) {
            Attributes::Resource(r) => r,
            other => panic!("{method} {path}: expected a resource request, got {other:?}"),
        }
    }

    #[test]
    fn discovery_and_other_paths_are_non_resource_requests() {
        for path in [
            "/version",
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps",
            "/apis/apps/v1",
            "/openapi/v2",
            "/healthz",
            "/metrics/foo/bar",
        ] {
            assert_eq!(
                Attributes::of("GET", path, &[]),
                Attributes::NonResource {
                    verb: "get".into(),
                    path: path.into()
                },
                "{path}"
            );
        }
    }

    #[test]
    fn verbs_follow_the_method_and_whether_a_name_is_given() {
        let cases = [
            ("GET", "/api/v1/namespaces/a/secrets/s", "get"),
            ("HEAD", "/api/v1/namespaces/a/secrets/s", "get"),
            ("GET", "/api/v1/namespaces/a/secrets", "list"),
            ("GET", "/api/v1/secrets", "list"),
            ("POST", "/api/v1/namespaces/a/secrets", "create"),
            ("PUT", "/api/v1/namespaces/a/secrets/s", "update"),
            ("PATCH", "/api/v1/namespaces/a/secrets/s", "patch"),
            ("DELETE", "/api/v1/namespaces/a/secrets/s", "delete"),
            ("DELETE", "/api/v1/namespaces/a/secrets", "deletecollection"),
            ("GET", "/api/v1/watch/namespaces/a/secrets", "watch"),
        ];
        for (method, path, verb) in cases {
            assert_eq!(resource(method, path, &[]).verb, verb, "{method} {path}");
        }
        assert_eq!(
            resource("GET", "/api/v1/namespaces/a/secrets", &[("watch", "true")]).verb,
            "watch"
        );
        assert_eq!(
            resource("GET", "/api/v1/namespaces/a/secrets", &[("watch", "false")]).verb,
            "list"
        );
    }

    #[test]
    fn paths_give_group_namespace_resource_name_and_subresource() {
        let r = resource(
            "PATCH",
            "/apis/cluster.x-k8s.io/v1beta1/namespaces/fleet/machines/m-1/status",
            &[],
        );
        assert_eq!(
            r,
            ResourceAttributes {
                verb: "patch".into(),
                group: "cluster.x-k8s.io".into(),
                version: "v1beta1".into(),
                resource: "machines".into(),
                subresource: "status".into(),
                namespace: "fleet".into(),
                name: "m-1".into(),
            }
        );
        assert_eq!(r.resource_path(), "machines/status");
        let cluster = resource(
            "GET",
            "/apis/caretaker.dev/v1alpha1/certificateauthorities/x",
            &[],
        );
        assert_eq!(
            (cluster.namespace.as_str(), cluster.name.as_str()),
            ("", "x")
        );
    }

    #[test]
    fn a_namespace_is_the_object_itself_and_its_own_namespace() {
        let ns = resource("GET", "/api/v1/namespaces/fleet", &[]);
        assert_eq!(
            (
                ns.resource.as_str(),
                ns.name.as_str(),
                ns.namespace.as_str()
            ),
            ("namespaces", "fleet", "fleet")
        );
        let status = resource("PUT", "/api/v1/namespaces/fleet/finalize", &[]);
        assert_eq!(
            (status.resource.as_str(), status.subresource.as_str()),
            ("namespaces", "finalize")
        );
        assert_eq!(resource("GET", "/api/v1/namespaces", &[]).verb, "list");
    }

    #[test]
    fn a_list_of_one_name_is_authorized_as_that_name() {
        let one = resource(
            "GET",
            "/api/v1/namespaces/a/secrets",
            &[
                ("watch", "1"),
                ("fieldSelector", "metadata.name=webhook-tls"),
            ],
        );
        assert_eq!(
            (one.verb.as_str(), one.name.as_str()),
            ("watch", "webhook-tls")
        );
        for selector in ["metadata.name=a,type=b", "type=b", "metadata.name="] {
            let r = resource(
                "GET",
                "/api/v1/namespaces/a/secrets",
                &[("fieldSelector", selector)],
            );
            assert_eq!(r.name, "", "{selector}");
        }
    }

    #[test]
    fn messages_name_the_request_as_kube_apiserver_does() {
        let r = Attributes::Resource(resource("GET", "/api/v1/nodes", &[]));
        assert_eq!(
            r.to_string(),
            "list resource \"nodes\" in API group \"\" at the cluster scope"
        );
        let sub = Attributes::Resource(resource(
            "PATCH",
            "/apis/caretaker.dev/v1alpha1/namespaces/d/issuedcertificates/w/status",
            &[],
        ));
        assert_eq!(
            sub.to_string(),
            "patch resource \"issuedcertificates/status\" in API group \"caretaker.dev\" in the namespace \"d\""
        );
    }
}
