/*
 * uri_path.h - the `path` attribute of /auth as the proxy routes it
 * (docs/proxies.md): one normalization of the path, whichever source it
 * came from (X-Original-URI, X-Forwarded-Uri or the /auth request's own
 * URL), so that a `path` rule cannot be dodged by writing the same path
 * another way (`/%6cogin`, `//login`, `/./login`, `/x/../login`).
 *
 * The steps are nginx's for $uri: the query (from `?`) and a fragment
 * (from `#`) are cut; an absolute URI ("http://host/login") keeps its
 * path; a path that does not start with "/" gets one; %XX escapes are
 * decoded once (an encoded slash or dot counts as one, "%2e%2e" is ".."),
 * an encoded NUL is refused as nginx refuses it, a malformed escape stays
 * as it is; runs of slashes become one; "." segments go, ".." removes the
 * segment before it and never climbs above "/".
 *
 * Pure: no I/O, no allocation, no state.  Any thread.
 */
#ifndef RL_URI_PATH_H
#define RL_URI_PATH_H

#include <stdbool.h>
#include <stddef.h>

/* The room uri_path_normalize() needs for an input of len bytes: the
 * result is never longer than len + 1, plus its NUL. */
#define URI_PATH_ROOM(len) ((len) + 2)

/*
 * Normalize the len bytes at in (a NUL among them ends the input) into
 * out, NUL-terminated.  raw: in is as the client sent it (a header):
 * query and fragment are cut and escapes decoded.  !raw: in is a path
 * already decoded once (libmicrohttpd decodes a request's URL): a query
 * is cut, the slashes and dot segments are resolved, nothing is decoded
 * again.
 * Returns 0, or -1 with a reason in err (an encoded NUL, or outlen below
 * URI_PATH_ROOM(len)), when out holds nothing to use.
 */
int uri_path_normalize(const char *in, size_t len, bool raw, char *out,
    size_t outlen, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/*
 * Does the path of target, a request target as the client sent it (up to
 * the first '?', where libmicrohttpd cuts the query off), hold an encoded
 * NUL?  libmicrohttpd decodes in one pass from the left and no escape ends
 * in a '%', so every "%00" in it, and only those, becomes a NUL ("%2500"
 * is "%00", which stays); the URL it hands on is then cut there.
 */
bool uri_path_target_has_nul(const char *target);

#endif
