//! trusted_header mode: the user id (and scopes and tenant) from headers an
//! authenticating proxy sets, believed only from that proxy's addresses.

use axum::http::header::HeaderName;
use axum::http::{HeaderMap, HeaderValue};

use super::{AuthError, Identity, user_id};

/// trusted_header mode: which headers, believed from which peers.
pub(super) struct Trusted {
    /// The header holding the user id.
    pub(super) user: HeaderName,
    /// The header holding the space-separated scopes.
    pub(super) scope: HeaderName,
    /// The header holding the tenant, when `tenant_claim` is configured.
    pub(super) tenant: Option<HeaderName>,
    /// The scope that lets a credential report provider answers.
    pub(super) feedback_scope: String,
    /// The peers whose headers are believed.
    pub(super) proxies: Vec<ipnet::IpNet>,
}

impl Trusted {
    /// The identity of trusted_header mode: the headers, if `peer` is a
    /// trusted proxy.
    pub(super) fn identify(
        &self,
        headers: &HeaderMap,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Identity, AuthError> {
        let trusted = peer.is_some_and(|ip| {
            let ip = ip.to_canonical();
            self.proxies.iter().any(|net| net.contains(&ip))
        });
        if !trusted {
            return Err(AuthError::UntrustedPeer);
        }
        let user = one_header(headers, &self.user)?.ok_or(AuthError::MissingTrustedHeader)?;
        let user = std::str::from_utf8(user.as_bytes())
            .map_err(|_| AuthError::InvalidUserId("it is not valid UTF-8"))?;
        let user = user_id(user).map_err(AuthError::InvalidUserId)?;
        let feedback = match one_header(headers, &self.scope)? {
            Some(v) => header_text(v)?.split(' ').any(|s| s == self.feedback_scope),
            None => false,
        };
        let tenant = match &self.tenant {
            None => None,
            Some(name) => match one_header(headers, name)? {
                Some(v) => Some(header_text(v)?.to_owned()),
                None => None,
            },
        };
        Ok(Identity {
            user,
            feedback,
            tenant,
        })
    }

    /// The startup banner's description of this mode.
    pub(super) fn describe(&self) -> String {
        format!(
            "trusted_header (the user id is the `{}` header, which the authenticating \
             proxy in front must set on every request and strip from clients; believed only \
             from {})",
            self.user,
            self.proxies
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

fn header_text(v: &HeaderValue) -> Result<&str, AuthError> {
    std::str::from_utf8(v.as_bytes())
        .map_err(|_| AuthError::Malformed("an identity header is not valid UTF-8"))
}

/// A header's one value; `None` when absent, an error when repeated.
fn one_header<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, AuthError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(AuthError::Malformed(
            "an identity header appears more than once",
        ));
    }
    Ok(Some(value))
}

#[cfg(test)]
mod tests;
