package dns

import (
	"strings"

	mdns "github.com/miekg/dns"
)

// InZone reports whether name (any case, fully qualified or not) is clusterset.local or
// below it. A name whose last labels only look like the zone because of an escaped dot
// ("a\.clusterset.local.") is not in it.
func InZone(name string) bool {
	return inZone(asciiLower(mdns.Fqdn(name)))
}

// inZone is InZone for a lower-case, fully qualified name.
func inZone(lname string) bool {
	if lname == Origin {
		return true
	}
	if len(lname) <= len(Origin) || !strings.HasSuffix(lname, Origin) {
		return false
	}
	dot := len(lname) - len(Origin) - 1
	if lname[dot] != '.' {
		return false
	}
	// The dot must not be escaped: count the backslashes before it.
	bs := 0
	for i := dot - 1; i >= 0 && lname[i] == '\\'; i-- {
		bs++
	}
	return bs%2 == 0
}

// asciiLower lower-cases the ASCII letters of s and nothing else, so the result has the
// length of s (strings.ToLower would turn invalid UTF-8 into U+FFFD).
func asciiLower(s string) string {
	i := 0
	for i < len(s) && (s[i] < 'A' || s[i] > 'Z') {
		i++
	}
	if i == len(s) {
		return s
	}
	b := []byte(s)
	for ; i < len(b); i++ {
		if c := b[i]; c >= 'A' && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}

// Answer is the pure core of the DNS server: the authoritative response of zone z to req.
// It does no I/O and never truncates (the server does that for its transport); the response
// may share records with z, which the caller must not modify.
//
//   - req is a response (QR set) or nil: nil, nothing is sent back.
//   - opcode other than QUERY: NOTIMP. Not exactly one question, or more than one OPT: FORMERR.
//     EDNS version other than 0: BADVERS.
//   - a name outside clusterset.local: REFUSED (the server forwards those when it has an
//     upstream, before calling Answer).
//   - z is nil (no state received yet): answered from an empty zone, with SERVFAIL where the
//     answer would be NXDOMAIN, as CoreDNS's multicluster plugin does before it has synced.
//   - a class other than IN (or ANY), or a zone transfer: REFUSED.
//   - otherwise NOERROR with the records, NODATA (NOERROR, no answer) or NXDOMAIN, both with
//     the zone's SOA in the authority section. The answer section's owner names are the
//     question's name, case preserved.
//
// An EDNS0 request gets an OPT record with the same UDP size (at least 512) and DO bit.
func Answer(z *Zone, req *mdns.Msg) *mdns.Msg {
	if req == nil || req.Response {
		return nil
	}
	resp := new(mdns.Msg)
	resp.SetReply(req)
	// SetReply copies the first question only; a reply to a malformed query echoes none.
	if len(req.Question) != 1 {
		resp.Question = nil
	}
	var opt *mdns.OPT
	nOPT := 0
	for _, rr := range req.Extra {
		if o, ok := rr.(*mdns.OPT); ok {
			nOPT++
			opt = o
		}
	}
	if opt != nil {
		resp.Extra = []mdns.RR{replyOPT(opt)}
	}
	switch {
	case req.Opcode != mdns.OpcodeQuery:
		resp.Rcode = mdns.RcodeNotImplemented
		return resp
	case nOPT > 1 || len(req.Question) != 1:
		resp.Rcode = mdns.RcodeFormatError
		return resp
	case opt != nil && opt.Version() != 0:
		// RFC 6891 6.1.3: BADVERS needs the OPT record for its upper bits.
		resp.Rcode = mdns.RcodeBadVers
		return resp
	}
	q := req.Question[0]
	lname := asciiLower(mdns.Fqdn(q.Name))
	if !inZone(lname) || (q.Qclass != mdns.ClassINET && q.Qclass != mdns.ClassANY) {
		resp.Rcode = mdns.RcodeRefused
		return resp
	}
	if q.Qtype == mdns.TypeAXFR || q.Qtype == mdns.TypeIXFR {
		resp.Rcode = mdns.RcodeRefused
		return resp
	}
	if z == nil {
		z = unsyncedZone
	}
	resp.Authoritative = true
	n := z.nodes[lname]
	if n == nil {
		resp.Rcode = mdns.RcodeNameError
		if !z.synced {
			resp.Rcode = mdns.RcodeServerFailure
		}
		resp.Ns = soa(z, q.Name, lname)
		return resp
	}
	var answer, extra []mdns.RR
	switch q.Qtype {
	case mdns.TypeA:
		answer = n.a
	case mdns.TypeAAAA:
		answer = n.aaaa
	case mdns.TypeSRV:
		answer, extra = n.srv, n.srvExtra
	case mdns.TypeTXT:
		answer = n.txt
	case mdns.TypeSOA:
		answer = n.soa
	case mdns.TypeNS:
		answer, extra = n.ns, n.nsExtra
	}
	if len(answer) == 0 {
		resp.Ns = soa(z, q.Name, lname)
		return resp
	}
	if q.Name != lname {
		answer = withOwner(answer, mdns.Fqdn(q.Name))
	}
	resp.Answer = answer
	if opt != nil {
		// A new slice: the OPT record must not be appended into the zone's shared one.
		resp.Extra = append(append(make([]mdns.RR, 0, len(extra)+1), extra...), resp.Extra...)
	} else {
		resp.Extra = extra
	}
	resp.Compress = true
	return resp
}

// soa is the authority section of a negative answer: the zone's SOA, its owner in the case
// the question used.
func soa(z *Zone, qname, lname string) []mdns.RR {
	qname = mdns.Fqdn(qname)
	if len(qname) != len(lname) || qname == lname {
		return z.soa
	}
	origin := qname[len(qname)-len(Origin):]
	if origin == Origin {
		return z.soa
	}
	return withOwner(z.soa, origin)
}

// withOwner copies rrs with owner name name.
func withOwner(rrs []mdns.RR, name string) []mdns.RR {
	out := make([]mdns.RR, len(rrs))
	for i, rr := range rrs {
		out[i] = mdns.Copy(rr)
		out[i].Header().Name = name
	}
	return out
}

// replyOPT is the OPT record of a response to a request with opt: the request's UDP size
// (at least 512) and DO bit, no options.
func replyOPT(opt *mdns.OPT) *mdns.OPT {
	o := &mdns.OPT{Hdr: mdns.RR_Header{Name: ".", Rrtype: mdns.TypeOPT}}
	o.SetUDPSize(min(max(opt.UDPSize(), mdns.MinMsgSize), MaxUDPResponse))
	if opt.Do() {
		o.SetDo()
	}
	return o
}

// udpSize is the largest UDP response req's sender accepts: its EDNS0 size, at least 512.
func udpSize(req *mdns.Msg) int {
	if opt := req.IsEdns0(); opt != nil {
		return max(int(opt.UDPSize()), mdns.MinMsgSize)
	}
	return mdns.MinMsgSize
}
