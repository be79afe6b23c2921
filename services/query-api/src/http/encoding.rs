//! Compression of large answers (`[http.compression]`): an answer of at least `min_bytes` goes
//! out in brotli or gzip when the client's `Accept-Encoding` takes one (brotli first at equal
//! weight), with `Vary: Accept-Encoding`, and its entity tag marked with the coding (a
//! compressed body is another representation: `"…-br"`, `"…-gzip"`). Smaller answers — a single
//! quote is about 700 bytes — go out as they are: compressing them costs more CPU than it saves
//! on the wire.
//!
//! Bodies are compressed whole, where they are made (the quote and batch routes build them in
//! memory anyway), so the hot path can compress too and the tag is the compressed body's. The
//! negotiation is ours; the codecs are `flate2` and `brotli`.

use std::io::Write;

use axum::http::{HeaderMap, HeaderValue, header};

use crate::config::CompressionSettings;

/// How answers are compressed; `None` in the state when compression is off.
#[derive(Debug, Clone, Copy)]
pub struct Compression {
    min_bytes: usize,
    gzip_level: u32,
    brotli_quality: u32,
}

/// A content coding this service produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Brotli,
    Gzip,
}

impl Coding {
    fn token(self) -> &'static str {
        match self {
            Coding::Brotli => "br",
            Coding::Gzip => "gzip",
        }
    }
}

impl Compression {
    pub fn from_settings(settings: &CompressionSettings) -> Option<Self> {
        settings.enabled.then_some(Self {
            min_bytes: settings.min_bytes,
            gzip_level: settings.gzip_level,
            brotli_quality: settings.brotli_quality,
        })
    }

    /// Whether a body of `len` bytes is large enough to be compressed (and so to vary by
    /// `Accept-Encoding`).
    pub fn applies_to(&self, len: usize) -> bool {
        len >= self.min_bytes
    }

    /// `body` in the coding `accept` prefers, or `None` when it takes neither (or the
    /// compressed body would not be smaller).
    pub fn compress(&self, accept: Option<&HeaderValue>, body: &[u8]) -> Option<(Coding, Vec<u8>)> {
        let coding = negotiate(accept?)?;
        let compressed = match coding {
            Coding::Gzip => {
                let mut encoder = flate2::write::GzEncoder::new(
                    Vec::with_capacity(body.len() / 4),
                    flate2::Compression::new(self.gzip_level),
                );
                encoder.write_all(body).ok()?;
                encoder.finish().ok()?
            }
            Coding::Brotli => {
                let mut out = Vec::with_capacity(body.len() / 4);
                let params = brotli::enc::BrotliEncoderParams {
                    quality: i32::try_from(self.brotli_quality).unwrap_or(4),
                    lgwin: 18,
                    size_hint: body.len(),
                    ..Default::default()
                };
                brotli::BrotliCompress(&mut &body[..], &mut out, &params).ok()?;
                out
            }
        };
        (compressed.len() < body.len()).then_some((coding, compressed))
    }
}

/// The coding to answer in: the highest-weighted of `br` and `gzip` (brotli at a tie), `*`
/// standing for either; a weight of 0 refuses. `None` when neither is acceptable.
pub fn negotiate(accept: &HeaderValue) -> Option<Coding> {
    let accept = accept.to_str().ok()?;
    let (mut brotli, mut gzip, mut any) = (None, None, None);
    for entry in accept.split(',') {
        let mut fields = entry.split(';');
        let coding = fields.next().unwrap_or("").trim();
        let weight = fields
            .find_map(|field| {
                let (name, value) = field.trim().split_once('=')?;
                name.trim().eq_ignore_ascii_case("q").then(|| value.trim())
            })
            .map_or(Some(1.0), |value| value.parse::<f32>().ok())
            .unwrap_or(0.0);
        if coding.eq_ignore_ascii_case("br") {
            brotli = Some(weight);
        } else if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            gzip = Some(weight);
        } else if coding == "*" {
            any = Some(weight);
        }
    }
    let brotli = brotli.or(any).unwrap_or(0.0);
    let gzip = gzip.or(any).unwrap_or(0.0);
    if brotli <= 0.0 && gzip <= 0.0 {
        None
    } else if brotli >= gzip {
        Some(Coding::Brotli)
    } else {
        Some(Coding::Gzip)
    }
}

/// Sets what a compressed (or compressible) answer needs: `Vary: Accept-Encoding`, and for a
/// compressed body its `Content-Encoding` and the coding appended to its tag.
pub fn mark(headers: &mut HeaderMap, coding: Option<Coding>, etag: &mut HeaderValue) {
    headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
    if let Some(coding) = coding {
        headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(coding.token()),
        );
        let tag = etag.as_bytes();
        // `"hash"` → `"hash-br"`.
        let marked = [
            &tag[..tag.len() - 1],
            b"-",
            coding.token().as_bytes(),
            b"\"",
        ]
        .concat();
        if let Ok(marked) = HeaderValue::from_bytes(&marked) {
            *etag = marked;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn accept(value: &'static str) -> HeaderValue {
        HeaderValue::from_static(value)
    }

    #[test]
    fn negotiation_follows_weights_and_prefers_brotli() {
        let cases = [
            ("gzip, deflate, br", Some(Coding::Brotli)),
            ("gzip", Some(Coding::Gzip)),
            ("br;q=0.5, gzip;q=0.8", Some(Coding::Gzip)),
            ("br;q=0, gzip", Some(Coding::Gzip)),
            ("gzip;q=0", None),
            ("identity", None),
            ("*", Some(Coding::Brotli)),
            ("*;q=0.1, br;q=0", Some(Coding::Gzip)),
            ("deflate", None),
            ("GZIP", Some(Coding::Gzip)),
            ("gzip;q=nonsense", None),
        ];
        for (value, expected) in cases {
            assert_eq!(negotiate(&accept(value)), expected, "{value}");
        }
    }

    #[test]
    fn large_bodies_round_trip_in_both_codings_and_small_ones_are_left_alone() {
        let compression = Compression {
            min_bytes: 1024,
            gzip_level: 1,
            brotli_quality: 4,
        };
        let body = br#"{"platform":"taobao","item_id":"100001","status":200},"#.repeat(60);
        assert!(compression.applies_to(body.len()));
        assert!(!compression.applies_to(700));

        let (coding, gzipped) = compression.compress(Some(&accept("gzip")), &body).unwrap();
        assert_eq!(coding, Coding::Gzip);
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&gzipped[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, body);

        let (coding, brotli) = compression.compress(Some(&accept("br")), &body).unwrap();
        assert_eq!(coding, Coding::Brotli);
        let mut plain = Vec::new();
        brotli::BrotliDecompress(&mut &brotli[..], &mut plain).unwrap();
        assert_eq!(plain, body);
        assert!(brotli.len() < body.len() / 5);

        assert!(compression.compress(None, &body).is_none());
        assert!(
            compression
                .compress(Some(&accept("identity")), &body)
                .is_none()
        );
    }

    #[test]
    fn a_compressed_answer_varies_and_its_tag_names_the_coding() {
        let mut headers = HeaderMap::new();
        let mut etag = HeaderValue::from_static("\"abc\"");
        mark(&mut headers, Some(Coding::Brotli), &mut etag);
        assert_eq!(etag, "\"abc-br\"");
        assert_eq!(headers[header::CONTENT_ENCODING], "br");
        assert_eq!(headers[header::VARY], "accept-encoding");
        let mut headers = HeaderMap::new();
        let mut etag = HeaderValue::from_static("\"abc\"");
        mark(&mut headers, None, &mut etag);
        assert_eq!(etag, "\"abc\"");
        assert!(headers.get(header::CONTENT_ENCODING).is_none());
    }
}
