//! A small namespace-resolved element tree over quick-xml, for SOAP answers.
//!
//! vim25 answers are small and read in full, so a tree is simpler than a streaming
//! decoder; names are matched by namespace URI and local name, never by prefix,
//! because vcsim and vCenter pick different prefixes (vcsim binds the XML Schema
//! instance namespace to `XMLSchema-instance:`, not `xsi:`).

use std::borrow::Cow;

use quick_xml::NsReader;
use quick_xml::events::Event;
use quick_xml::name::ResolveResult;

/// The XML Schema instance namespace, whose `type` attribute names a value's type.
pub(crate) const XSI: &str = "http://www.w3.org/2001/XMLSchema-instance";

/// Deeper documents are refused: no vim25 answer nests this far, and a bound keeps a
/// hostile document from exhausting the stack when the tree is dropped.
const MAX_DEPTH: usize = 128;

/// One element: its namespace and local name, attributes, text and children.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Element {
    /// The namespace URI, `None` when unbound.
    pub ns: Option<String>,
    /// The local name (without prefix).
    pub name: String,
    /// Attributes as (namespace URI, local name, unescaped value).
    pub attrs: Vec<(Option<String>, String, String)>,
    /// The concatenated, unescaped text directly inside the element.
    pub text: String,
    /// Child elements in document order.
    pub children: Vec<Element>,
}

impl Element {
    /// The first child with local name `name`.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Every child with local name `name`.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The descendant reached by following `path` (local names) from here.
    #[cfg(test)]
    pub fn path(&self, path: &[&str]) -> Option<&Element> {
        path.iter().try_fold(self, |e, name| e.child(name))
    }

    /// The text of the child `name`, if present.
    pub fn child_text(&self, name: &str) -> Option<&str> {
        self.child(name).map(|c| c.text.as_str())
    }

    /// An attribute without namespace, such as a managed object reference's `type`.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(ns, local, _)| ns.is_none() && local == name)
            .map(|(_, _, v)| v.as_str())
    }

    /// The `xsi:type` of the element, whatever its prefix, without the type's own
    /// prefix (`vim25:InvalidPowerState` reads `InvalidPowerState`).
    pub fn xsi_type(&self) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(ns, local, _)| ns.as_deref() == Some(XSI) && local == "type")
            .map(|(_, _, v)| v.rsplit(':').next().unwrap_or(v))
    }
}

/// XML Schema's own types, written with the `xsd:` prefix the request envelope binds.
const XSD_TYPES: &[&str] = &[
    "string",
    "int",
    "long",
    "short",
    "byte",
    "boolean",
    "float",
    "double",
    "dateTime",
    "base64Binary",
    "anyURI",
];

impl Element {
    /// The element written back as `tag` for a request: children, text and `xsi:type`
    /// (and a reference's `type`), under the envelope's prefixes. For sending back an
    /// object read from the server with a field changed (a device to edit).
    pub fn to_xml(&self, tag: &str) -> String {
        let mut out = String::new();
        self.write(tag, &mut out);
        out
    }

    fn write(&self, tag: &str, out: &mut String) {
        out.push('<');
        out.push_str(tag);
        if let Some(t) = self.xsi_type() {
            let prefix = if XSD_TYPES.contains(&t) { "xsd:" } else { "" };
            out.push_str(&format!(" xsi:type=\"{prefix}{}\"", escape(t)));
        }
        if let Some(t) = self.attr("type") {
            out.push_str(&format!(" type=\"{}\"", escape(t)));
        }
        out.push('>');
        if self.children.is_empty() {
            out.push_str(&escape(&self.text));
        }
        for c in &self.children {
            c.write(&c.name, out);
        }
        out.push_str("</");
        out.push_str(tag);
        out.push('>');
    }
}

/// Parses a whole document into its root element. Errors are described in words (no
/// input is echoed, since answers can carry secrets).
pub(crate) fn parse(input: &[u8]) -> Result<Element, String> {
    let text = std::str::from_utf8(input).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut reader = NsReader::from_str(text);
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    loop {
        let (ns, event) = reader
            .read_resolved_event()
            .map_err(|e| format!("malformed XML: {e}"))?;
        let ns = owned_ns(ns)?;
        match event {
            Event::Start(start) | Event::Empty(start) if root.is_some() => {
                let _ = start;
                return Err("content after the root element".into());
            }
            Event::Start(start) => {
                let element = open(&reader, &start, ns, stack.len())?;
                stack.push(element);
            }
            Event::Empty(start) => {
                // An empty element closes at once; quick-xml reports no End for it.
                let element = open(&reader, &start, ns, stack.len())?;
                stack.push(element);
                close(&mut stack, &mut root);
            }
            Event::End(_) => close(&mut stack, &mut root),
            Event::Text(t) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&t.xml10_content());
                }
            }
            Event::CData(c) => {
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&c.xml10_content());
                }
            }
            Event::GeneralRef(r) => {
                let ch: Cow<'_, str> = match r.resolve_char_ref() {
                    Ok(Some(c)) => Cow::Owned(c.to_string()),
                    Ok(None) => match r.as_ref() {
                        "amp" => "&".into(),
                        "lt" => "<".into(),
                        "gt" => ">".into(),
                        "quot" => "\"".into(),
                        "apos" => "'".into(),
                        other => return Err(format!("unknown entity &{other};")),
                    },
                    Err(e) => return Err(format!("bad character reference: {e}")),
                };
                if let Some(top) = stack.last_mut() {
                    top.text.push_str(&ch);
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !stack.is_empty() {
        return Err("the document ends inside an element".into());
    }
    root.ok_or_else(|| "no root element".into())
}

/// An element from its start tag, attributes resolved and unescaped.
fn open(
    reader: &NsReader<&[u8]>,
    start: &quick_xml::events::BytesStart<'_>,
    ns: Option<String>,
    depth: usize,
) -> Result<Element, String> {
    if depth >= MAX_DEPTH {
        return Err(format!("elements nested deeper than {MAX_DEPTH}"));
    }
    let mut element = Element {
        ns,
        name: start.local_name().as_ref().to_owned(),
        ..Element::default()
    };
    for attr in start.attributes() {
        let attr = attr.map_err(|e| format!("malformed attribute: {e}"))?;
        let key = attr.key.as_ref();
        if key == "xmlns" || key.starts_with("xmlns:") {
            continue;
        }
        let (attr_ns, local) = reader.resolver().resolve_attribute(attr.key);
        let attr_ns = owned_ns(attr_ns)?;
        let value = attr
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| format!("malformed attribute value: {e}"))?;
        element
            .attrs
            .push((attr_ns, local.as_ref().to_owned(), value.into_owned()));
    }
    Ok(element)
}

/// Ends the innermost open element: into its parent, or as the root.
fn close(stack: &mut Vec<Element>, root: &mut Option<Element>) {
    if let Some(done) = stack.pop() {
        match stack.last_mut() {
            Some(parent) => parent.children.push(done),
            None => *root = Some(done),
        }
    }
}

/// A resolved namespace as an owned URI; an undeclared prefix is an error.
fn owned_ns(ns: ResolveResult<'_>) -> Result<Option<String>, String> {
    match ns {
        ResolveResult::Bound(ns) => Ok(Some(ns.0.to_owned())),
        ResolveResult::Unbound => Ok(None),
        ResolveResult::Unknown(prefix) => Err(format!("undeclared namespace prefix {prefix:?}")),
    }
}

/// `s` escaped for element text or an attribute value.
pub(crate) fn escape(s: &str) -> Cow<'_, str> {
    quick_xml::escape::escape(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xsi_type_is_found_by_namespace_not_prefix() {
        let doc = br#"<a xmlns="urn:vim25" xmlns:XMLSchema-instance="http://www.w3.org/2001/XMLSchema-instance"><v XMLSchema-instance:type="xsd:string">x &amp; &#65;</v><w xsi:type="Nope" xmlns:xsi="urn:other"/></a>"#;
        let root = parse(doc).unwrap();
        assert_eq!(root.ns.as_deref(), Some("urn:vim25"));
        let v = root.child("v").unwrap();
        assert_eq!(v.xsi_type(), Some("string"));
        assert_eq!(v.text, "x & A");
        assert_eq!(root.child("w").unwrap().xsi_type(), None);
    }

    #[test]
    fn elements_are_written_back_with_their_types() {
        let doc = br#"<a xmlns="urn:vim25" xmlns:X="http://www.w3.org/2001/XMLSchema-instance"><d X:type="VirtualDisk"><key>2000</key><n X:type="xsd:int">5</n><r type="Network">net-1</r><t>&lt;</t></d></a>"#;
        let root = parse(doc).unwrap();
        assert_eq!(
            root.child("d").unwrap().to_xml("device"),
            "<device xsi:type=\"VirtualDisk\"><key>2000</key><n xsi:type=\"xsd:int\">5</n><r type=\"Network\">net-1</r><t>&lt;</t></device>"
        );
    }

    #[test]
    fn broken_documents_are_errors() {
        for doc in [
            &b"<a><b></a>"[..],
            b"<a>",
            b"",
            b"<x:a/>",
            b"<a/><b/>",
            b"\xff",
        ] {
            assert!(parse(doc).is_err(), "{:?}", String::from_utf8_lossy(doc));
        }
        let deep = "<a>".repeat(10_000);
        assert!(parse(deep.as_bytes()).unwrap_err().contains("deeper"));
    }

    proptest::proptest! {
        // Arbitrary input never panics: it parses or is an error.
        #[test]
        fn arbitrary_input_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn arbitrary_markup_never_panics(s in "[<>/a-c:=\"' &#;x0-9]{0,200}") {
            let _ = parse(s.as_bytes());
        }
    }
}
