package httpserve

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// CheckBrowser refuses what a web page can make a browser send to an endpoint on this
// machine without the page being allowed to (no CORS preflight is needed for a "simple"
// request): it returns 403 and why when r carries an Origin header that is not a loopback
// origin (http or https on localhost, 127.0.0.0/8 or [::1], any port), and 415 and why
// when r is a POST whose Content-Type is not application/json (a browser sends a
// cross-site application/json POST only after a preflight, which toolfence never grants).
// It returns 0 and nil for a request to serve. Clients that are not browsers (the MCP
// SDKs, toolfence's own) send application/json and no Origin, or a loopback one.
func CheckBrowser(r *http.Request) (status int, why error) {
	if o := strings.TrimSpace(r.Header.Get("Origin")); o != "" && !LoopbackOrigin(o) {
		return http.StatusForbidden, fmt.Errorf("requests from web pages are refused: Origin %.100q is not a loopback origin (http(s)://localhost, 127.0.0.1 or [::1])", o)
	}
	if r.Method == http.MethodPost {
		ct := r.Header.Get("Content-Type")
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return http.StatusUnsupportedMediaType, fmt.Errorf("send Content-Type: application/json (this request has %.100q)", ct)
		}
	}
	return 0, nil
}

// LoopbackOrigin reports whether origin (an Origin header's value) is http or https on
// localhost or a loopback IP address, with or without a port.
func LoopbackOrigin(origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil || (u.Path != "" && u.Path != "/") {
		return false
	}
	return LoopbackHost(u.Hostname())
}

// LoopbackHost reports whether host (a name or an IP address, without port or brackets)
// is localhost or a loopback address.
func LoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Zone() == "" && ip.Unmap().IsLoopback()
}

// LoopbackConn reports whether r arrived on a loopback connection. Requests without a
// local address (not from net/http's server) are not loopback.
func LoopbackConn(r *http.Request) bool {
	addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || addr == nil {
		return false
	}
	ap, err := netip.ParseAddrPort(addr.String())
	return err == nil && ap.Addr().IsLoopback()
}
