//! Reading what a request declares about its body.

use http::header::CONTENT_LENGTH;
use http::HeaderMap;

/// A `Content-Length` that cannot be trusted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct InvalidContentLength;

/// The body length the request declares, if it declares one.
///
/// Several `Content-Length` values (in separate headers or one
/// comma-separated list) are accepted only if they agree, as RFC 9110
/// §8.6 allows; anything but plain digits is refused.
pub(crate) fn declared_length(headers: &HeaderMap) -> Result<Option<u64>, InvalidContentLength> {
    let mut length = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        let value = value.to_str().map_err(|_| InvalidContentLength)?;
        for part in value.split(',') {
            let part = part.trim_matches([' ', '\t']);
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(InvalidContentLength);
            }
            let parsed: u64 = part.parse().map_err(|_| InvalidContentLength)?;
            match length {
                Some(seen) if seen != parsed => return Err(InvalidContentLength),
                _ => length = Some(parsed),
            }
        }
    }
    Ok(length)
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(CONTENT_LENGTH, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn absent_length_is_none() {
        assert_eq!(declared_length(&headers(&[])), Ok(None));
    }

    #[test]
    fn plain_length_is_read() {
        assert_eq!(declared_length(&headers(&["42"])), Ok(Some(42)));
    }

    #[test]
    fn agreeing_duplicates_are_one_length() {
        assert_eq!(declared_length(&headers(&["7", "7"])), Ok(Some(7)));
        assert_eq!(declared_length(&headers(&["7, 7"])), Ok(Some(7)));
    }

    #[test]
    fn disagreeing_duplicates_are_refused() {
        assert_eq!(
            declared_length(&headers(&["7", "8"])),
            Err(InvalidContentLength)
        );
        assert_eq!(
            declared_length(&headers(&["7,8"])),
            Err(InvalidContentLength)
        );
    }

    #[test]
    fn signs_words_and_overflow_are_refused() {
        for bad in [
            "-1",
            "+1",
            "",
            "1e3",
            "abc",
            "99999999999999999999999",
            "1 2",
            "0x10",
        ] {
            assert_eq!(
                declared_length(&headers(&[bad])),
                Err(InvalidContentLength),
                "{bad:?}"
            );
        }
    }
}
