// Package limits holds the bounds of what the broker's API accepts, so that the broker's
// admission and clients (cablectl) check the same numbers: every request is checked against them
// before anything is stored, and a refusal names the field and the limit. No request can grow the
// state, or a watch message, without bound.
package limits

const (
	// MaxLabels bounds a cluster's labels and a policy's metadata.labels.
	MaxLabels = 64
	// MaxClusterCIDRs bounds a cluster's pod CIDRs, and its service CIDRs.
	MaxClusterCIDRs = 16
	// MaxLabelChanges bounds the labels one LabelCluster request sets and removes.
	MaxLabelChanges = 64

	// MaxPolicyJSONBytes bounds one policy as stored (its JSON).
	MaxPolicyJSONBytes = 64 << 10
	// MaxPoliciesPerApply bounds the policies of one apply (and of one delete).
	MaxPoliciesPerApply = 256
	// MaxApplyBytes bounds the policies' JSON in one apply, below the gRPC message limit (4 MiB).
	MaxApplyBytes = 3 << 20
	// MaxPolicies bounds the policies of the mesh.
	MaxPolicies = 4096
	// MaxDriverOptions bounds a policy's cableDriver.options; MaxOptionValueBytes one value.
	MaxDriverOptions    = 32
	MaxOptionValueBytes = 1024
	// MaxSelectorRequirements bounds a selector's matchLabels plus matchExpressions;
	// MaxSelectorValues the values of one expression.
	MaxSelectorRequirements = 32
	MaxSelectorValues       = 64

	// Endpoint bounds: drivers, cable ports and attributes (per driver), subnets.
	MaxEndpointDrivers       = 16
	MaxEndpointSubnets       = 64
	MaxAttributesPerDriver   = 16
	MaxAttributeKeyBytes     = 253
	MaxAttributeValueBytes   = 1024
	MaxExportsPerNode        = 512
	MaxExportEndpointsPerSet = 65536

	// MaxTokenBytes bounds a join token, MaxCSRBytes a certificate request, MaxSelectorBytes an
	// import selector.
	MaxTokenBytes    = 4 << 10
	MaxCSRBytes      = 16 << 10
	MaxSelectorBytes = 4 << 10

	// MaxWatchEncodings bounds a watch's accept_encodings, MaxEncodingNameBytes one name.
	MaxWatchEncodings    = 8
	MaxEncodingNameBytes = 32
)
