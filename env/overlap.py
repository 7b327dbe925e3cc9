"""Exact overlap depth of convex polyhedra (separating axis theorem), batched in torch.

The penetration flag asks how deep a block is inside the plate. Both are convex polyhedra (the block's
prism; each convex plate piece and rail), so the separating axis theorem answers exactly: two convex
polyhedra overlap iff their projections overlap on every candidate axis (the face normals of both and
the cross products of their edge directions), and the smallest projection overlap is the depth of the
minimum translation that separates them. It needs no contact report, so the CPU and GPU backends give
the same number; a test checks it against PhysX's own contact separations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Polytope:
    """A convex polyhedron as vertices, face normals and edge directions (all (n, 3), unit axes)."""

    vertices: np.ndarray
    normals: np.ndarray
    edges: np.ndarray


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def prism(vertices: np.ndarray) -> Polytope:
    """A right prism from its (2n, 3) vertices: bottom ring (CCW seen from above), then the top ring."""
    vertices = np.asarray(vertices, dtype=np.float64)
    n = len(vertices) // 2
    ring = vertices[:n]
    edges = np.roll(ring, -1, axis=0) - ring
    axis = _unit(vertices[n] - vertices[0])
    side = _unit(np.cross(edges, axis))
    centre = ring.mean(0)
    side = np.where(((ring - centre) * side).sum(-1, keepdims=True) < 0, -side, side)  # outward
    return Polytope(vertices, np.vstack([side, axis, -axis]), np.vstack([_unit(edges), axis]))


def box(centre, half) -> Polytope:
    c, h = np.asarray(centre, dtype=np.float64), np.asarray(half, dtype=np.float64)
    ring = np.array([[h[0], -h[1]], [h[0], h[1]], [-h[0], h[1]], [-h[0], -h[1]]])
    verts = np.vstack([np.column_stack([ring, np.full(4, -h[2])]), np.column_stack([ring, np.full(4, h[2])])])
    return prism(verts + c)


def _pad(rows: list[np.ndarray]) -> torch.Tensor:
    """Stack arrays of different lengths by repeating each one's first row (a repeated vertex or axis
    changes no projection)."""
    n = max(len(r) for r in rows)
    return torch.tensor(np.stack([np.concatenate([r, np.repeat(r[:1], n - len(r), 0)]) for r in rows]),
                        dtype=torch.float32)


@dataclass
class PolytopeSet:
    """Several polytopes padded to common sizes: vertices (P, V, 3), normals (P, F, 3), edges (P, E, 3)."""

    vertices: torch.Tensor
    normals: torch.Tensor
    edges: torch.Tensor

    @classmethod
    def of(cls, polytopes: list[Polytope]) -> "PolytopeSet":
        return cls(_pad([p.vertices for p in polytopes]), _pad([p.normals for p in polytopes]),
                   _pad([p.edges for p in polytopes]))

    def to(self, device) -> "PolytopeSet":
        return PolytopeSet(self.vertices.to(device), self.normals.to(device), self.edges.to(device))

    def first(self) -> "PolytopeSet":
        """The first polytope alone, unpadded arrays without the set axis."""
        return PolytopeSet(self.vertices[0], self.normals[0], self.edges[0])


def _axis_overlap(axes: torch.Tensor, a_vertices: torch.Tensor, b_vertices: torch.Tensor) -> torch.Tensor:
    """(n, axes) overlap of the two vertex sets' projections on each axis (<= 0: the axis separates them)."""
    pa = torch.einsum("nav,nkv->nak", axes, a_vertices)
    pb = torch.einsum("nav,nkv->nak", axes, b_vertices)
    return torch.minimum(pa.amax(-1), pb.amax(-1)) - torch.maximum(pa.amin(-1), pb.amin(-1))


def overlap_depth(a_vertices: torch.Tensor, a_normals: torch.Tensor, a_edges: torch.Tensor,
                  b_vertices: torch.Tensor, b_normals: torch.Tensor, b_edges: torch.Tensor) -> torch.Tensor:
    """Depth (m) of the overlap of pairs of convex polyhedra; <= 0 where they do not overlap.

    Shapes: vertices (n, V, 3), normals (n, F, 3), edges (n, E, 3) for each side of n pairs; returns (n,).
    The face normals are tried first: most pairs a bounding box cannot tell apart are separated by one,
    and only the others need the edge-pair axes.
    """
    depth = _axis_overlap(torch.cat([a_normals, b_normals], dim=1), a_vertices, b_vertices).amin(-1)
    left = (depth > 0).nonzero(as_tuple=True)[0]
    if len(left) == 0:
        return depth
    ae, be = a_edges[left], b_edges[left]
    cross = torch.cross(ae[:, :, None, :].expand(-1, -1, be.shape[1], -1),
                        be[:, None, :, :].expand(-1, ae.shape[1], -1, -1), dim=-1).flatten(1, 2)
    length = torch.linalg.norm(cross, dim=-1, keepdim=True)
    edge = _axis_overlap(cross / length.clamp_min(1e-6), a_vertices[left], b_vertices[left])
    edge = torch.where(length[..., 0] > 1e-6, edge, torch.full_like(edge, float("inf")))  # parallel edges: no axis
    return depth.index_put((left,), torch.minimum(depth[left], edge.amin(-1)))
