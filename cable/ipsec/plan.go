package ipsec

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/cablemesh/cablemesh/cable"
)

// This file holds the pure half of the driver: validating a remote endpoint, deciding who
// initiates, building the VICI messages, comparing them with what charon reports, and computing
// the tunnel MTU. No I/O.

// ConnPrefix starts the name of every connection and shared key the driver loads into charon, so
// cleanup (also against a system charon) finds exactly ours.
const ConnPrefix = "cbl-"

// ConnName is the name of the IKE connection, of its one CHILD_SA config and of its shared key
// for the remote cluster.
func ConnName(cluster string) string { return ConnPrefix + cluster }

// clusterFromConn is the inverse of ConnName ("" when name is not ours).
func clusterFromConn(name string) string {
	c, ok := strings.CutPrefix(name, ConnPrefix)
	if !ok {
		return ""
	}
	return c
}

// minPSKLen is the shortest pre-shared key we accept: the broker derives 32 bytes; anything much
// shorter is a bug upstream, and strongSwan itself warns below 20.
const minPSKLen = 16

// desiredConn is the connection one remote cluster should have in charon. PSK is kept apart from
// everything that is logged, hashed or compared.
type desiredConn struct {
	Name       string
	Cluster    string
	Node       string
	LocalAddr  netip.Addr
	RemoteAddr netip.Addr
	RemotePort uint16
	LocalTS    []netip.Prefix
	RemoteTS   []netip.Prefix
	Initiator  bool
	Opts       options
	// Proto is set for a transport-mode connection (NewEmbedded): its traffic selectors are
	// LocalTS and RemoteTS (the two underlay addresses) narrowed to this protocol and Ports.
	Proto string
	Ports TransportPorts
}

// transport reports whether want is a transport-mode connection.
func (want desiredConn) transport() bool { return want.Proto != "" }

// localTS and remoteTS are the traffic selectors as charon takes and reports them: a prefix, and
// for transport mode "[proto/port]" after it (strongSwan prints ports it finds no service name
// for as numbers; the VXLAN ports we use have none in /etc/services).
func (want desiredConn) localTS() []string  { return want.tsStrings(want.LocalTS, want.Ports.Local) }
func (want desiredConn) remoteTS() []string { return want.tsStrings(want.RemoteTS, want.Ports.Remote) }

func (want desiredConn) tsStrings(ps []netip.Prefix, port uint16) []string {
	out := prefixStrings(ps)
	if want.transport() {
		for i := range out {
			out[i] += fmt.Sprintf("[%s/%d]", want.Proto, port)
		}
	}
	return out
}

// desiredTransport builds a transport-mode connection to remote: the traffic selectors are the
// two underlay addresses (host prefixes) narrowed to proto and ports. The remote's subnets are
// not part of it: what travels inside the protected traffic is the embedding driver's business.
func desiredTransport(local cable.LocalNode, remote cable.RemoteEndpoint, opts options, proto string, ports TransportPorts) (desiredConn, error) {
	// desiredFromRemote checks everything but the subnets; give it the local and remote host
	// prefixes to carry, which cannot overlap (the addresses differ).
	la, ra := local.AdvertiseAddress.Unmap(), remote.Address.Unmap()
	if !la.IsValid() || !ra.IsValid() {
		return desiredFromRemote(local, remote, opts) // reports the bad address
	}
	local.LocalSubnets = []netip.Prefix{netip.PrefixFrom(la, la.BitLen())}
	remote.Subnets = []netip.Prefix{netip.PrefixFrom(ra, ra.BitLen())}
	remote.LocalSubnets = nil // transport mode protects the underlay hosts, never the pair's subnets
	want, err := desiredFromRemote(local, remote, opts)
	if err != nil {
		return desiredConn{}, err
	}
	if ports.Local == 0 || ports.Remote == 0 {
		return desiredConn{}, fmt.Errorf("ipsec connect to cluster %s: transport ports %d/%d: want both set", remote.Cluster, ports.Local, ports.Remote)
	}
	want.Proto, want.Ports = proto, ports
	return want, nil
}

// desiredFromRemote validates remote against the local node and builds the connection. Errors
// name the field and never contain the key.
func desiredFromRemote(local cable.LocalNode, remote cable.RemoteEndpoint, opts options) (desiredConn, error) {
	if err := validClusterName(remote.Cluster); err != nil {
		return desiredConn{}, fmt.Errorf("ipsec connect: remote cluster %q: %w", remote.Cluster, err)
	}
	if err := cable.CheckRemote(Name, remote); err != nil {
		return desiredConn{}, err
	}
	where := "ipsec connect to cluster " + remote.Cluster
	if !local.AdvertiseAddress.IsValid() || local.AdvertiseAddress.IsUnspecified() {
		return desiredConn{}, fmt.Errorf("%s: local advertise address %q is not a usable IP", where, local.AdvertiseAddress)
	}
	la, ra := local.AdvertiseAddress.Unmap(), remote.Address.Unmap()
	if la == ra {
		return desiredConn{}, fmt.Errorf("%s: address %s is this node's own advertise address", where, ra)
	}
	if la.Is4() != ra.Is4() {
		return desiredConn{}, fmt.Errorf("%s: address %s and local advertise address %s are of different IP families", where, ra, la)
	}
	if len(remote.PreSharedKey) < minPSKLen {
		// The length is safe to say; the key is not.
		return desiredConn{}, fmt.Errorf("%s: pre-shared key has %d bytes, want at least %d", where, len(remote.PreSharedKey), minPSKLen)
	}
	remoteTS, err := cable.NormalizeSubnets(remote.Subnets)
	if err != nil {
		return desiredConn{}, fmt.Errorf("%s: subnets: %w", where, err)
	}
	if len(remoteTS) == 0 {
		return desiredConn{}, fmt.Errorf("%s: subnets: empty, nothing to carry", where)
	}
	// A gateway-mode pair carries only the two mesh addresses: its LocalSubnets (own mesh /32)
	// replace the node's pod CIDRs as the local traffic selectors.
	localTS, err := cable.NormalizeSubnets(remote.SourceSubnets(local))
	if err != nil {
		return desiredConn{}, fmt.Errorf("%s: local subnets: %w", where, err)
	}
	if len(localTS) == 0 {
		return desiredConn{}, fmt.Errorf("%s: local subnets: empty, nothing to carry", where)
	}
	if r, l, found := cable.Overlap(remoteTS, localTS); found {
		return desiredConn{}, fmt.Errorf("%s: subnet %s overlaps local subnet %s", where, r, l)
	}
	port := remote.Port
	if port == 0 {
		port = DefaultPort
	}
	return desiredConn{
		Name:       ConnName(remote.Cluster),
		Cluster:    remote.Cluster,
		Node:       remote.Node,
		LocalAddr:  la,
		RemoteAddr: ra,
		RemotePort: port,
		LocalTS:    localTS,
		RemoteTS:   remoteTS,
		Initiator:  isInitiator(la, ra),
		Opts:       opts,
	}, nil
}

// checkConflicts refuses want when it cannot live beside the loaded connections, or on this
// datapath.
func checkConflicts(want desiredConn, libipsec bool, loaded map[string]*loadedConn) error {
	if libipsec && !want.Opts.Encap {
		return fmt.Errorf("option %s=false: kernel-libipsec sends ESP only in UDP (encap must be true here)", optEncap)
	}
	others := make(map[string][]netip.Prefix, len(loaded))
	for _, c := range loaded {
		others[c.want.Cluster] = c.want.RemoteTS
	}
	return cable.CheckOverlap(want.Cluster, want.RemoteTS, others)
}

// validClusterName keeps connection names printable and unambiguous in charon's logs and in
// swanctl output.
func validClusterName(name string) error {
	if name == "" {
		return fmt.Errorf("empty")
	}
	if len(name) > 63 {
		return fmt.Errorf("%d bytes, want at most 63", len(name))
	}
	for _, r := range name {
		if r > unicode.MaxASCII || !(unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("invalid character %q", r)
		}
	}
	return nil
}

// isInitiator decides which end starts IKE: the one with the smaller underlay address. Both ends
// compute the same answer from the same two addresses, so exactly one initiates and the pair
// never builds duplicate SAs; the other end only responds (start_action none).
func isInitiator(local, remote netip.Addr) bool {
	return local.Unmap().Less(remote.Unmap())
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// Timers of every connection. DPD every 10s notices a dead peer within about 35s with the
// retransmission settings of strongswan.conf; the initiator then starts again (dpd_action
// restart) while the responder just clears (dpd_action clear) and waits.
//
// close_action is none on both ends. The peer closes (deletes) an IKE_SA on purpose: when its
// agent removes the connection (the pair leaves ipsec, the cluster goes) or when its agent or
// charon stops. With close_action start the initiator's charon would start a new IKE_SA at once,
// before its own agent unloads a connection that is being removed (the peer refuses it with
// NO_PROPOSAL_CHOSEN), and a peer that is restarting cannot answer yet anyway. The driver's
// keeper re-initiates instead: it sees the IKE_SA gone, waits lossGrace for our own agent to
// remove the connection too, then initiates with a short, growing backoff until the restarted
// peer has loaded its side.
const (
	dpdDelay = "10s"
)

// connMessage is the body of VICI load-conn for want, as nested maps (section -> map, list ->
// []string, value -> string). It never contains the key: that goes by load-shared.
func connMessage(want desiredConn) map[string]any {
	startAction, dpdAction, closeAction := "none", "clear", "none"
	if want.Initiator {
		startAction, dpdAction = "start", "restart"
	}
	mode := "tunnel"
	if want.transport() {
		mode = "transport"
	}
	child := map[string]any{
		"mode":          mode,
		"local_ts":      want.localTS(),
		"remote_ts":     want.remoteTS(),
		"esp_proposals": slices.Clone(want.Opts.ESPProposals),
		"start_action":  startAction,
		"dpd_action":    dpdAction,
		"close_action":  closeAction,
	}
	conn := map[string]any{
		"version":      "2",
		"local_addrs":  []string{want.LocalAddr.String()},
		"remote_addrs": []string{want.RemoteAddr.String()},
		"remote_port":  fmt.Sprint(want.RemotePort),
		"proposals":    slices.Clone(want.Opts.IKEProposals),
		"encap":        yesNo(want.Opts.Encap),
		// A restarted peer's new IKE_SA replaces the old one instead of living beside it.
		"unique": "replace",
		// The initiator retries forever: the responder may come up much later.
		"keyingtries": "0",
		"dpd_delay":   dpdDelay,
		// Gateways have fixed addresses; MOBIKE would only add address-update exchanges.
		"mobike": "no",
		"local": map[string]any{
			"auth": "psk",
			"id":   localID(want),
		},
		"remote": map[string]any{
			"auth": "psk",
			"id":   remoteID(want),
		},
		"children": map[string]any{
			want.Name: child,
		},
	}
	return map[string]any{want.Name: conn}
}

// The IKE identities are the underlay addresses: both ends know both (the remote's from its
// broker endpoint), and the shared key is bound to exactly this pair of identities.
func localID(want desiredConn) string  { return want.LocalAddr.String() }
func remoteID(want desiredConn) string { return want.RemoteAddr.String() }

// sharedMessage is the body of VICI load-shared for want's key, loaded under id (keyID). It holds
// the secret: it is built only right before the call and never logged, hashed into fingerprints
// or stored.
func sharedMessage(want desiredConn, id string, psk []byte) map[string]any {
	return map[string]any{
		"id":     id,
		"type":   "IKE",
		"data":   string(psk),
		"owners": []string{localID(want), remoteID(want)},
	}
}

// fingerprint identifies a load-conn message (which holds no secret): equal fingerprints mean
// charon was given exactly this configuration.
func fingerprint(msg map[string]any) string {
	// encoding/json sorts map keys, so the encoding is canonical.
	data, err := json.Marshal(msg)
	if err != nil {
		panic(fmt.Sprintf("ipsec: fingerprint of a load-conn message: %v", err)) // maps of strings always encode
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// keyIDSep separates the connection name from the tag in a key id. Cluster names cannot hold it.
const keyIDSep = "#"

// keyID is the id under which the pre-shared key of the connection name is loaded into charon:
// the name, keyIDSep and a tag, an HMAC keyed with the key over the fingerprint of the
// connection's load-conn message. charon lists the ids of its keys (get-shared), never the keys,
// and list-conns shows only part of a connection (no proposals, no encap), so the tag is how a
// driver that did not load them itself (after an agent restart, its charon adopted) tells that
// the key and the connection charon holds are exactly the ones it wants, with nothing of either
// on disk. 96 bits of an HMAC say nothing usable about a key of 16 bytes or more.
func keyID(name, fp string, psk []byte) string {
	mac := hmac.New(sha256.New, psk)
	mac.Write([]byte("cablemesh ipsec key id v1\x00" + fp))
	return name + keyIDSep + hex.EncodeToString(mac.Sum(nil)[:12])
}

// connOfKeyID is the connection name of a key id (the id itself for a key loaded under the bare
// name by an earlier version of the driver).
func connOfKeyID(id string) string {
	name, _, _ := strings.Cut(id, keyIDSep)
	return name
}

// keyIDsOf are the ids of ids that belong to the connection name.
func keyIDsOf(ids []string, name string) []string {
	var out []string
	for _, id := range ids {
		if connOfKeyID(id) == name {
			out = append(out, id)
		}
	}
	return out
}

// connPlan is what Connect does to charon for one connection.
type connPlan struct {
	// loadKey loads the pre-shared key (load-shared) under the wanted key id.
	loadKey bool
	// unloadKeys are the other key ids of the connection to unload once the wanted one is in.
	unloadKeys []string
	// loadConn loads the connection (load-conn); takeDown first unloads it and terminates its
	// SAs, which keep the old selectors (or the old key's authentication) otherwise.
	loadConn, takeDown bool
}

func (p connPlan) empty() bool { return !p.loadKey && !p.loadConn && len(p.unloadKeys) == 0 }

// planConn decides what makes charon hold want and its key, loaded under id (keyID of want's
// load-conn fingerprint and the key): loaded is charon's list-conns section for want (nil when
// none), ids the key ids charon holds, old what this process loaded before (nil when nothing).
//
// charon is the record: the key id charon holds says which key and which connection message were
// loaded, by this process or by an earlier one whose charon it adopted. So:
//   - the wanted id and a matching connection: nothing to do, also right after an agent restart;
//   - the wanted id without the connection (unloaded behind our back): load the connection;
//   - another id of ours for the connection: the key or the connection changed since it was
//     loaded: load the key, take the connection down (its SAs were negotiated under the old key
//     or configuration) and load it again;
//   - no id for it: charon lost the key, or it was loaded by an older driver under the bare name
//     (a system charon): load the key, and the connection on top when it matches as far as
//     list-conns shows, which charon treats as no change (its SAs stay up); when this process
//     knows it loaded exactly this connection, the key alone.
func planConn(loaded map[string]any, ids []string, old *loadedConn, want desiredConn, id string) connPlan {
	matches := loaded != nil && loadedMatches(loaded, want)
	var others []string
	tagged, hasOldTag := false, false
	for _, k := range keyIDsOf(ids, want.Name) {
		switch {
		case k == id:
			tagged = true
		default:
			others = append(others, k)
			hasOldTag = hasOldTag || k != want.Name
		}
	}
	p := connPlan{unloadKeys: others}
	switch {
	case tagged && matches:
	case tagged && loaded == nil:
		p.loadConn = true
	case tagged:
		// charon holds the connection otherwise than it was loaded with this key id.
		p.loadConn, p.takeDown = true, true
	case loaded == nil:
		p.loadKey, p.loadConn = true, true
	case hasOldTag || !matches:
		p.loadKey, p.loadConn, p.takeDown = true, true, true
	case old != nil && old.keyID == id:
		p.loadKey = true
	default:
		p.loadKey, p.loadConn = true, true
	}
	return p
}

// loadedMatches compares what charon's list-conns reports for our connection (one "list-conn"
// event section, as nested maps) with want: addresses and traffic selectors, the parts charon
// could silently disagree on. The rest is covered by the fingerprint of what we loaded.
func loadedMatches(loaded map[string]any, want desiredConn) bool {
	if !sameStrings(listOf(loaded["local_addrs"]), []string{want.LocalAddr.String()}) ||
		!sameStrings(listOf(loaded["remote_addrs"]), []string{want.RemoteAddr.String()}) {
		return false
	}
	children, _ := loaded["children"].(map[string]any)
	child, ok := children[want.Name].(map[string]any)
	if !ok {
		return false
	}
	return sameStrings(listOf(child["local-ts"]), want.localTS()) &&
		sameStrings(listOf(child["remote-ts"]), want.remoteTS())
}

func listOf(v any) []string {
	switch x := v.(type) {
	case []string:
		return x
	case string:
		return []string{x}
	}
	return nil
}

func sameStrings(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// ESP overhead, worst case per packet, with UDP encapsulation: outer IP header (20 or 40) + UDP
// 8 + ESP header 8 + IV + padding + pad length and next header 2 + ICV. With AES-GCM (our
// default): IV 8, padding at most 3 (4-byte alignment), ICV 16. With a CBC cipher and HMAC the
// worst case is IV 16, padding 15, ICV up to 32.
const (
	overheadAEAD4 = 20 + 8 + 8 + 8 + 3 + 2 + 16
	overheadAEAD6 = overheadAEAD4 + 20
	overheadCBC4  = 20 + 8 + 8 + 16 + 15 + 2 + 32
	overheadCBC6  = overheadCBC4 + 20
)

// tunnelMTU is the MTU of the routes into the tunnel. setting is the mtu setting (0: derive it
// from the underlay). aead says whether every ESP proposal the node uses is an AEAD. libipsec
// caps it at LibipsecMTU, and refuses a larger explicit setting because libipsec would silently
// drop the packets between the two.
func tunnelMTU(setting, underlay int, libipsec, v6, aead bool) (int, error) {
	if setting != 0 {
		if libipsec && setting > LibipsecMTU {
			return 0, cable.BadSetting(Name, keyMTU, strconv.Itoa(setting), "is more than kernel-libipsec carries (at most %d-byte packets)", LibipsecMTU)
		}
		return setting, nil
	}
	over := overheadCBC4
	switch {
	case aead && v6:
		over = overheadAEAD6
	case aead:
		over = overheadAEAD4
	case v6:
		over = overheadCBC6
	}
	m := underlay - over
	if libipsec {
		m = min(m, LibipsecMTU)
	}
	return max(m, MinMTU), nil
}

// mssFor is the TCP MSS advertised on the tunnel routes: the MTU less the inner IP and TCP
// headers, for the larger (IPv6) header when any local subnet is IPv6 because charon takes one
// value for all routes.
func mssFor(mtu int, subnets []netip.Prefix) int {
	for _, p := range subnets {
		if p.Addr().Is6() && !p.Addr().Is4In6() {
			return mtu - 60
		}
	}
	return mtu - 40
}

// isAEAD reports whether an ESP proposal uses only combined-mode ciphers (GCM, CCM,
// ChaCha20-Poly1305), so it needs no separate integrity algorithm.
func isAEAD(proposal string) bool {
	for _, alg := range strings.Split(proposal, "-") {
		if strings.Contains(alg, "gcm") || strings.Contains(alg, "ccm") || strings.Contains(alg, "chacha20poly1305") {
			return true
		}
	}
	return false
}

// allAEAD reports whether every proposal is an AEAD one.
func allAEAD(proposals []string) bool {
	for _, p := range proposals {
		if !isAEAD(p) {
			return false
		}
	}
	return len(proposals) > 0
}
