package apiv1

// BrokerServerName is the DNS name in the broker's serving certificate. Clients verify the broker
// against the mesh CA under this fixed name rather than the address they dialled, so a broker
// listening on 0.0.0.0 or behind NAT needs no per-address certificate.
const BrokerServerName = "cable-broker.cablemesh"
