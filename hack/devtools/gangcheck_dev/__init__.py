"""gangcheck's development tooling, kept out of the product distribution.

:mod:`gangcheck_dev.testbed` runs a real control plane on loopback (etcd, kube-apiserver and,
for the full stack, kube-scheduler, kube-controller-manager, kwok, Kueue and an autoscaler);
:mod:`gangcheck_dev.simcloud` plays a cloud answering ProvisioningRequests with real Node
objects; :mod:`gangcheck_dev.demo` puts gangcheck and two GPU gangs on the full stack. It may
import gangcheck; gangcheck never imports it.
"""
