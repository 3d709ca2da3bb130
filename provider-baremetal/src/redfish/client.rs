//! The wire half: the few typed Redfish calls the provider makes, over HTTPS (or HTTP
//! when the pool allows it), with HTTP basic auth and every error mapped by
//! [`super::errors`].
//!
//! Written by hand rather than with nv-redfish: the provider needs nine calls on four
//! resources (Systems, ComputerSystem, its Reset action, VirtualMedia), while
//! nv-redfish 0.22 measured +33 s of build, pins the MSRV at our toolchain (1.95) and
//! brings reqwest 0.12 beside the workspace's reqwest 0.13 (a second hyper/rustls
//! stack and TLS settings made twice).

use std::fmt;

use machine_core::{Error, ExposeSecret, Result, SecretString};
use provider_http::HttpClient;
use reqwest::{Method, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::errors;

/// A BMC account: user name and password (the password is a secret, never shown).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcCredentials {
    /// The account's user name.
    pub username: String,
    /// Its password.
    #[serde(deserialize_with = "secret")]
    pub password: SecretString,
}

fn secret<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<SecretString, D::Error> {
    String::deserialize(d).map(SecretString::from)
}

impl BmcCredentials {
    /// Credentials for `username` with `password`.
    pub fn new(username: impl Into<String>, password: SecretString) -> Self {
        BmcCredentials {
            username: username.into(),
            password,
        }
    }
}

impl fmt::Debug for BmcCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BmcCredentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// A system's power state as the BMC reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off.
    Off,
    /// Powering on.
    PoweringOn,
    /// Powering off.
    PoweringOff,
    /// Paused (a VM behind the BMC).
    Paused,
    /// Anything else a BMC says.
    #[serde(other)]
    Unknown,
}

/// The boot-override part of a system.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Boot {
    /// `Disabled`, `Once` or `Continuous`.
    #[serde(default)]
    pub boot_source_override_enabled: Option<String>,
    /// `Pxe`, `Cd`, `Hdd`, `UefiHttp`, ...
    #[serde(default)]
    pub boot_source_override_target: Option<String>,
    /// The targets the BMC allows, when it says.
    #[serde(default, rename = "BootSourceOverrideTarget@Redfish.AllowableValues")]
    pub allowed_targets: Vec<String>,
}

/// A reference to another resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct Link {
    #[serde(rename = "@odata.id")]
    pub id: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Actions {
    #[serde(default, rename = "#ComputerSystem.Reset")]
    reset: Option<ResetAction>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct ResetAction {
    target: String,
    #[serde(default, rename = "ResetType@Redfish.AllowableValues")]
    allowed: Vec<String>,
}

/// What the provider reads of a ComputerSystem.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct System {
    /// The system's id (the last segment of its path).
    pub id: String,
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// Its power state (absent on some BMCs while it changes).
    #[serde(default)]
    pub power_state: Option<PowerState>,
    /// Its boot override.
    #[serde(default)]
    pub boot: Boot,
    /// Its asset tag, where the BMC has one.
    #[serde(default)]
    pub asset_tag: Option<String>,
    #[serde(default)]
    actions: Actions,
    #[serde(default)]
    virtual_media: Option<Link>,
    #[serde(rename = "@odata.id")]
    path: String,
}

impl System {
    /// The reset types the BMC accepts (`ResetType@Redfish.AllowableValues`); empty
    /// when it does not say.
    pub fn reset_types(&self) -> &[String] {
        self.actions
            .reset
            .as_ref()
            .map(|r| r.allowed.as_slice())
            .unwrap_or_default()
    }

    /// The system's resource path (`/redfish/v1/Systems/<id>`).
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// What the provider reads of a VirtualMedia device.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct VirtualMedia {
    /// The device's id (`Cd`).
    #[serde(default)]
    pub id: String,
    /// The media types it takes (`CD`, `DVD`, `Floppy`, `USBStick`).
    #[serde(default)]
    pub media_types: Vec<String>,
    /// The inserted image's URL, empty or absent when none.
    #[serde(default)]
    pub image: Option<String>,
    /// Whether an image is inserted.
    #[serde(default)]
    pub inserted: Option<bool>,
    #[serde(rename = "@odata.id")]
    path: String,
}

impl VirtualMedia {
    /// Whether this device takes CD or DVD images.
    pub fn is_cd(&self) -> bool {
        self.media_types.iter().any(|t| t == "CD" || t == "DVD")
    }

    /// The device's resource path.
    pub fn path(&self) -> &str {
        &self.path
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Collection {
    #[serde(default)]
    members: Vec<Link>,
}

/// A client for one BMC: its base URL (`https://bmc.example:443`) and credentials.
#[derive(Clone)]
pub struct RedfishClient {
    http: HttpClient,
    base: Url,
    credentials: BmcCredentials,
}

impl fmt::Debug for RedfishClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedfishClient")
            // Redacted: a base URL built in code may carry user information.
            .field("base", &machine_core::redact_url(self.base.as_str()))
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl RedfishClient {
    /// A client for the BMC at `base` over `http` (shared, its connections pooled;
    /// its TLS settings are the BMC's).
    pub fn new(http: HttpClient, base: Url, credentials: BmcCredentials) -> Self {
        RedfishClient {
            http,
            base,
            credentials,
        }
    }

    /// The BMC's base URL.
    pub fn base(&self) -> &Url {
        &self.base
    }

    fn url(&self, path: &str) -> Result<Url> {
        self.base
            .join(path)
            .map_err(|e| Error::permanent(format!("the BMC link {path:?} is not a URL path: {e}")))
    }

    /// Sends one request; returns the body of a success, maps anything else.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Vec<u8>> {
        let what = format!("{method} {path}");
        let mut req = self
            .http
            .inner()
            .request(method, self.url(path)?)
            .basic_auth(
                &self.credentials.username,
                Some(self.credentials.password.expose_secret()),
            )
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = self.http.send(req).await.map_err(|e| e.context(&what))?;
        let status = resp.status();
        let retry_after = provider_http::retry_after(resp.headers());
        let bytes = resp.bytes().await.map_err(|e| {
            Error::transient(format!("{what}: the answer was cut: {}", e.without_url()))
        })?;
        if !status.is_success() {
            return Err(errors::from_status(
                &what,
                status.as_u16(),
                retry_after,
                &bytes,
            ));
        }
        Ok(bytes.to_vec())
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let body = self.call(Method::GET, path, None).await?;
        serde_json::from_slice(&body)
            .map_err(|e| errors::unreadable(&format!("GET {path}"), &e, &body))
    }

    /// The paths of the systems the BMC manages (`/redfish/v1/Systems/<id>`).
    pub async fn systems(&self) -> Result<Vec<String>> {
        let c: Collection = self.get("/redfish/v1/Systems").await?;
        Ok(c.members.into_iter().map(|m| m.id).collect())
    }

    /// The system with `id`.
    pub async fn system(&self, id: &str) -> Result<System> {
        self.get(&system_path(id)).await
    }

    /// Runs `reset_type` (`On`, `ForceOff`, ...) through the system's Reset action. The
    /// BMC answers at once; the power state follows later.
    pub async fn reset(&self, system: &System, reset_type: &str) -> Result<()> {
        let target = system
            .actions
            .reset
            .as_ref()
            .map(|r| r.target.clone())
            .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", system.path));
        self.call(
            Method::POST,
            &target,
            Some(json!({ "ResetType": reset_type })),
        )
        .await
        .map(drop)
    }

    /// Sets the boot override to `target` (`Cd`, `Pxe`, `UefiHttp`) for the next boot
    /// only (`once`) or every boot.
    pub async fn set_boot_override(&self, system: &System, target: &str, once: bool) -> Result<()> {
        let enabled = if once { "Once" } else { "Continuous" };
        let body = json!({"Boot": {
            "BootSourceOverrideTarget": target,
            "BootSourceOverrideEnabled": enabled,
        }});
        self.call(Method::PATCH, &system.path, Some(body))
            .await
            .map(drop)
    }

    /// Sets the system's asset tag.
    pub async fn set_asset_tag(&self, system: &System, tag: &str) -> Result<()> {
        self.call(
            Method::PATCH,
            &system.path,
            Some(json!({ "AssetTag": tag })),
        )
        .await
        .map(drop)
    }

    /// The system's virtual media devices.
    pub async fn virtual_media(&self, system: &System) -> Result<Vec<VirtualMedia>> {
        let Some(link) = &system.virtual_media else {
            return Ok(Vec::new());
        };
        let c: Collection = self.get(&link.id).await?;
        let mut devices = Vec::with_capacity(c.members.len());
        for m in c.members {
            devices.push(self.get(&m.id).await?);
        }
        Ok(devices)
    }

    /// The system's first virtual CD (or DVD) drive, reading the devices in order only
    /// up to it; a permanent error when it has none.
    pub async fn virtual_cd(&self, system: &System) -> Result<VirtualMedia> {
        let none = || {
            Error::permanent(format!(
                "system {} has no virtual CD drive (VirtualMedia with MediaTypes CD or DVD)",
                system.id
            ))
        };
        let link = system.virtual_media.as_ref().ok_or_else(none)?;
        let c: Collection = self.get(&link.id).await?;
        for m in c.members {
            let device: VirtualMedia = self.get(&m.id).await?;
            if device.is_cd() {
                return Ok(device);
            }
        }
        Err(none())
    }

    /// Re-reads one virtual media device.
    pub async fn media(&self, device: &VirtualMedia) -> Result<VirtualMedia> {
        self.get(&device.path).await
    }

    /// Reads the virtual media device at `path` (as [`VirtualMedia::path`] gave it).
    pub async fn media_at(&self, path: &str) -> Result<VirtualMedia> {
        self.get(path).await
    }

    /// Inserts the image at `url` (the BMC downloads it) into `device`.
    pub async fn insert_media(&self, device: &VirtualMedia, url: &str) -> Result<()> {
        let body = json!({"Image": url, "Inserted": true, "WriteProtected": true});
        self.call(
            Method::POST,
            &format!("{}/Actions/VirtualMedia.InsertMedia", device.path),
            Some(body),
        )
        .await
        .map(drop)
    }

    /// Ejects whatever `device` holds.
    pub async fn eject_media(&self, device: &VirtualMedia) -> Result<()> {
        self.eject_media_at(&device.path).await
    }

    /// Ejects whatever the device at `path` (as [`VirtualMedia::path`] gave it) holds,
    /// without reading it first.
    pub async fn eject_media_at(&self, path: &str) -> Result<()> {
        self.call(
            Method::POST,
            &format!("{path}/Actions/VirtualMedia.EjectMedia"),
            Some(json!({})),
        )
        .await
        .map(drop)
    }
}

/// The path of the system with `id`.
pub(crate) fn system_path(id: &str) -> String {
    format!("/redfish/v1/Systems/{id}")
}
