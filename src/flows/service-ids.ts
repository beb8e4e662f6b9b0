/**
 * The service-id convention shared with the kernel side: the traced services
 * are an ordered list, and a service's id (what the BPF programs stamp on
 * each event) is its index in that list plus one; 0 means "no service".
 */
import { ServiceSpec } from '../net/ipv4';

/** Each service with the id the kernel will report it under. */
export function serviceIdsOf(services: readonly ServiceSpec[]): Array<{ service: ServiceSpec; id: number }> {
  return services.map((service, i) => ({ service, id: i + 1 }));
}

/** The service an event's service id names, if any. */
export function serviceById(services: readonly ServiceSpec[], id: number): ServiceSpec | undefined {
  return id >= 1 ? services[id - 1] : undefined;
}

/** How a service is named in events, flows and the stream: `ADDR:PORT/PROTO` (`*` for a NodePort). */
export function serviceLabel(s: ServiceSpec): string {
  return `${s.address ?? '*'}:${s.port}/${s.proto}`;
}

/** The label of the service an id names, or `service#ID` for an id outside the list. */
export function serviceLabelById(services: readonly ServiceSpec[], id: number): string {
  const s = serviceById(services, id);
  return s ? serviceLabel(s) : `service#${id}`;
}
