package ipsec

import (
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/ipsec/spec"
)

// The driver's name, settings and options are its spec's (cable/ipsec/spec), which the broker and
// cablectl link without this datapath.
const (
	Name                = spec.Name
	DefaultPort         = spec.DefaultPort
	DefaultNATTPort     = spec.DefaultNATTPort
	DefaultCharon       = spec.DefaultCharon
	MinMTU              = spec.MinMTU
	MaxMTU              = spec.MaxMTU
	LibipsecMTU         = spec.LibipsecMTU
	DefaultIKEProposals = spec.DefaultIKEProposals
	DefaultESPProposals = spec.DefaultESPProposals
	DatapathAuto        = spec.DatapathAuto
	DatapathKernel      = spec.DatapathKernel
	DatapathLibipsec    = spec.DatapathLibipsec
	keyUseSystemCharon  = spec.KeyUseSystemCharon
	keyMTU              = spec.KeyMTU
	keyCharon           = spec.KeyCharon
	optEncap            = spec.OptEncap
)

type (
	// Datapath says where ESP runs.
	Datapath = spec.Datapath
	config   = spec.Config
	options  = spec.Options
)

func parseSettings(s cable.Settings) (config, error) { return spec.ParseSettings(s) }

func parseOptions(o cable.Options) (options, error) { return spec.ParseOptions(o) }
