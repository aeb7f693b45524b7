package admission

import "github.com/cablemesh/cablemesh/api/limits"

// Bounds of what the API accepts, declared in api/limits so that clients check the same numbers
// (see there for what each bounds). Every request is checked against them before anything is
// stored, and a refusal names the field and the limit (*InvalidError).
const (
	MaxLabels                = limits.MaxLabels
	MaxClusterCIDRs          = limits.MaxClusterCIDRs
	MaxLabelChanges          = limits.MaxLabelChanges
	MaxPolicyJSONBytes       = limits.MaxPolicyJSONBytes
	MaxPoliciesPerApply      = limits.MaxPoliciesPerApply
	MaxApplyBytes            = limits.MaxApplyBytes
	MaxPolicies              = limits.MaxPolicies
	MaxDriverOptions         = limits.MaxDriverOptions
	MaxOptionValueBytes      = limits.MaxOptionValueBytes
	MaxSelectorRequirements  = limits.MaxSelectorRequirements
	MaxSelectorValues        = limits.MaxSelectorValues
	MaxEndpointDrivers       = limits.MaxEndpointDrivers
	MaxEndpointSubnets       = limits.MaxEndpointSubnets
	MaxAttributesPerDriver   = limits.MaxAttributesPerDriver
	MaxAttributeKeyBytes     = limits.MaxAttributeKeyBytes
	MaxAttributeValueBytes   = limits.MaxAttributeValueBytes
	MaxExportsPerNode        = limits.MaxExportsPerNode
	MaxExportEndpointsPerSet = limits.MaxExportEndpointsPerSet
	MaxTokenBytes            = limits.MaxTokenBytes
	MaxCSRBytes              = limits.MaxCSRBytes
	MaxSelectorBytes         = limits.MaxSelectorBytes
	MaxWatchEncodings        = limits.MaxWatchEncodings
	MaxEncodingNameBytes     = limits.MaxEncodingNameBytes
)
