package vxlanipsec

import (
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/vxlanipsec/spec"
)

// The driver's name, settings, options and published attributes are its spec's
// (cable/vxlanipsec/spec), which the broker and cablectl link without this datapath.
const (
	Name                   = spec.Name
	DefaultVXLANPort       = spec.DefaultVXLANPort
	DefaultVNI             = spec.DefaultVNI
	DefaultInterfacePrefix = spec.DefaultInterfacePrefix
	DefaultIKEPort         = spec.DefaultIKEPort
	DefaultNATTPort        = spec.DefaultNATTPort
	ESPTransportOverhead   = spec.ESPTransportOverhead
	Overhead               = spec.Overhead
	AttrVXLANPort          = spec.AttrVXLANPort
	keyIKEPort             = spec.KeyIKEPort
)

type (
	config      = spec.Config
	pairOptions = spec.PairOptions
)

func parseSettings(s cable.Settings) (config, error) { return spec.ParseSettings(s) }

func parseOptions(o cable.Options) (pairOptions, error) { return spec.ParseOptions(o) }

func checkPublished(attrs map[string]string) error { return spec.CheckPublished(attrs) }

func remoteVXLANPort(attrs map[string]string) (uint16, error) { return spec.RemoteVXLANPort(attrs) }

func rename(err error, keys map[string]string) error { return spec.Rename(err, keys) }
